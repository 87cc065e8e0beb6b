// The gateway end to end on the request path: auth_request against a control server (a small
// fastify app answering dstack's `POST /api/projects/:project/get`), the stats Nginx's access log
// feeds to GET /api/stats/collect, and GET /metrics.

import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';
import {
  call,
  directReplica,
  integrationDoc,
  requestsIn30s,
  sampleValue,
  scrape,
  startControlServer,
  startGatewayWith,
  type ControlServer,
  type ServiceDoc,
} from './integration-harness.js';

const MEMBER = 'member-token-0123456789';
const OUTSIDER = 'outsider-token-0123456789';
const PRIVATE = 'private.gw.test';
const COUNTED = 'counted.gw.test';

let server: ControlServer;
let t: TestGateway;
const apps: Server[] = [];
let services: ServiceDoc[];

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER], other: [OUTSIDER] });
  const [p0, p1] = (await freePorts(2)) as [number, number];
  apps.push(await startEcho('private', { port: p0 }), await startEcho('counted', { port: p1 }));
  t = await startGatewayWith({ serverUrl: server.url, authCacheTtl: '60' });
  services = [
    { run: 'private', domain: PRIVATE, auth: true, replicas: [directReplica('private-r0', p0)] },
    { run: 'counted', domain: COUNTED, replicas: [directReplica('counted-r0', p1)] },
  ];
  const r = await putState(t, integrationDoc({ services }));
  expect(r.status).toBe(200);
});

afterAll(async () => {
  await t?.cleanup();
  await server?.close();
  for (const s of apps) await close(s);
});

/** A request to the private service from 127.0.0.2: Nginx treats it as a remote client. */
function remote(token?: string) {
  return call({
    port: t.httpPort,
    host: PRIVATE,
    path: '/data',
    localAddress: '127.0.0.2',
    ...(token !== undefined ? { headers: { authorization: `Bearer ${token}` } } : {}),
  });
}

describe('auth through the control server', () => {
  it('answers 401 without a token, 403 for a token that is not a member, 200 for a member', async () => {
    const none = await remote();
    expect(none.status).toBe(401);
    const bad = await remote('not-a-real-token-0123');
    expect(bad.status).toBe(403);
    const outsider = await remote(OUTSIDER);
    expect(outsider.status).toBe(403);
    const member = await remote(MEMBER);
    expect(member.status).toBe(200);
    const echoed = JSON.parse(member.body) as { name: string; headers: Record<string, string> };
    expect(echoed.name).toBe('private');
    // The token is for the gateway: the replica never sees it.
    expect(echoed.headers.authorization).toBeUndefined();
    expect(server.calls).toContainEqual({ project: 'main', token: MEMBER });
    expect(server.calls).toContainEqual({ project: 'main', token: OUTSIDER });
  });

  it('caches a member token: a second request does not ask the control server again', async () => {
    expect((await remote(MEMBER)).status).toBe(200);
    const before = server.calls.length;
    expect((await remote(MEMBER)).status).toBe(200);
    expect(server.calls.length).toBe(before);
  });

  it('trusts no source address: a client relayed from 127.0.0.1 (a local TLS terminator) needs a token', async () => {
    const relay = await startTcpRelay(t.httpPort);
    try {
      const via = (token?: string) =>
        call({
          port: relay.port,
          host: PRIVATE,
          path: '/data',
          localAddress: '127.0.0.2',
          ...(token ? { headers: { authorization: `Bearer ${token}` } } : {}),
        });
      expect((await via()).status).toBe(401);
      expect((await via(OUTSIDER)).status).toBe(403);
      // Straight from 127.0.0.1 as well.
      expect((await call({ port: t.httpPort, host: PRIVATE, path: '/data' })).status).toBe(401);
      expect((await via(MEMBER)).status).toBe(200);
    } finally {
      await relay.close();
    }
  });
});

describe('stats for the autoscaler', () => {
  it('counts N requests of a service in the 30 s window', async () => {
    const n = 7;
    for (let i = 0; i < n; i++) expect((await call({ port: t.httpPort, host: COUNTED, path: `/req/${i}` })).status).toBe(200);
    const counted = await eventually(async () => ((await requestsIn30s(t, 'main', 'counted')) === n ? n : undefined), 30_000);
    expect(counted).toBe(n);
  });

  it('does not count requests refused by auth', async () => {
    // Replica hits so far: 1 member + 2 cached member + 1 relayed member = 4. Refusals (401/403) are
    // logged with hit 0; a request to another service afterwards marks the end of the batch.
    const before = await eventually(async () => {
      const v = await requestsIn30s(t, 'main', 'private');
      return v === 4 ? v : undefined;
    }, 30_000);
    expect((await remote()).status).toBe(401);
    expect((await remote('still-not-a-member-0')).status).toBe(403);
    const counted = await requestsIn30s(t, 'main', 'counted');
    expect((await call({ port: t.httpPort, host: COUNTED, path: '/marker' })).status).toBe(200);
    await eventually(async () => ((await requestsIn30s(t, 'main', 'counted')) === counted + 1 ? true : undefined), 30_000);
    expect(await requestsIn30s(t, 'main', 'private')).toBe(before);
  });
});

describe('GET /metrics', () => {
  it('parses as Prometheus text and counts a reload after a change', async () => {
    const first = await scrape(t);
    const reloads = sampleValue(first, 'dstack_proxy_nginx_reloads_total');
    expect(reloads).toBeGreaterThanOrEqual(1);
    expect(sampleValue(first, 'dstack_proxy_service_requests_total', { project: 'main', run: 'counted' })).toBeGreaterThanOrEqual(7);

    const [port] = (await freePorts(1)) as [number];
    apps.push(await startEcho('added', { port }));
    const r = await putState(
      t,
      integrationDoc({ services: [...services, { run: 'added', domain: 'added.gw.test', replicas: [directReplica('added-r0', port)] }] }),
    );
    expect(r.status).toBe(200);
    await eventually(async () => ((await call({ port: t.httpPort, host: 'added.gw.test' })).status === 200 ? true : undefined), 30_000);

    const second = await scrape(t);
    expect(sampleValue(second, 'dstack_proxy_nginx_reloads_total')).toBeGreaterThan(reloads!);
    // The applied config's hash: present, a sha256, and different once a site was added.
    const hashOf = (samples: typeof first): string | undefined =>
      samples.find((s) => s.name === 'dstack_proxy_nginx_config_info')?.labels.hash;
    expect(hashOf(first)).toMatch(/^[0-9a-f]{64}$/);
    expect(hashOf(second)).toMatch(/^[0-9a-f]{64}$/);
    expect(hashOf(second)).not.toBe(hashOf(first));
    expect(sampleValue(second, 'dstack_proxy_document_generation')).toBe(r.json.generation);
    expect(sampleValue(second, 'dstack_proxy_nginx_reloads_total')).toBe(t.gw.nginxStats.reloads);
  });
});
