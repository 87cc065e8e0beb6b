// A new service with auth or an OpenAI-format model is served through our default server before
// its own site is, against the real private Nginx, a control server (a small fastify app
// answering dstack's `POST /api/projects/:project/get`) and a replica that shows what reached it:
// the data plane checks the token as the site would (401 without, 403 for an outsider) and does
// not pass it on; a model's host gets the site's CORS (a preflight answered without the replica,
// the replica's own CORS headers replaced) on every answer, refusals included. A reload right after the one at start waits out a 15 s interval, so
// every answer here comes through the default server.

import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestGateway } from '../helpers/gateway.js';
import { close } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import {
  call,
  directReplica,
  integrationDoc,
  startControlServer,
  startGatewayWith,
  type ControlServer,
  type Reply,
} from './integration-harness.js';

const MEMBER = 'member-token-0123456789';
const OUTSIDER = 'outsider-token-0123456789';

let server: ControlServer;
let t: TestGateway;
let replica: Server;
/** What reached the replica: method, path and headers. */
const seen: { method: string; url: string; headers: Record<string, string | string[] | undefined> }[] = [];

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER], other: [OUTSIDER] });
  replica = createServer((req, res) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    res.setHeader('access-control-allow-origin', 'https://replica.example');
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ ok: true }));
  });
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  const port = (replica.address() as { port: number }).port;
  t = await startGatewayWith({ serverUrl: server.url, authCacheTtl: '60' }, { nginxLoop: { minReloadIntervalMs: 15_000 } });
  const r = await call({
    port: t.apiPort,
    host: '127.0.0.1',
    path: '/api/v1/state',
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(
      integrationDoc({
        services: [
          { run: 'private', domain: 'private.gw.test', auth: true, replicas: [directReplica('p0', port)] },
          {
            run: 'chat',
            domain: 'chat.gw.test',
            auth: true,
            model: { name: 'm', format: 'openai' },
            replicas: [directReplica('c0', port)],
          },
          { run: 'open-chat', domain: 'open-chat.gw.test', model: { name: 'm2', format: 'openai' }, replicas: [directReplica('o0', port)] },
          { run: 'plain', domain: 'plain.gw.test', replicas: [directReplica('n0', port)] },
        ],
      }),
    ),
  });
  expect(r.status).toBe(200);
  // The replicas are in the data plane: the public one answers.
  await eventually(async () => ((await get('plain.gw.test')).status === 200 ? true : undefined), 20_000);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await server?.close();
  if (replica) await close(replica);
});

function get(host: string, o: { token?: string; method?: string; headers?: Record<string, string> } = {}): Promise<Reply> {
  return call({
    port: t.httpPort,
    host,
    path: '/v1/models',
    method: o.method ?? 'GET',
    localAddress: '127.0.0.2',
    headers: { ...(o.token ? { authorization: `Bearer ${o.token}` } : {}), ...o.headers },
  });
}

/** None of the sites is served yet: what answered was the default server. */
function noSiteServed(): void {
  for (const d of ['private.gw.test', 'chat.gw.test', 'open-chat.gw.test', 'plain.gw.test']) {
    const ready = t.gw.controller.statuses().loops.nginx?.objects[d]?.conditions.find((c) => c.type === 'Ready');
    expect(ready?.reason).not.toBe('Applied');
  }
}

describe('a service with auth, before its site is served', () => {
  it('checks the token as its site would, and does not pass it on', async () => {
    seen.length = 0;
    const refused = await get('private.gw.test');
    expect(refused.status).toBe(401);
    expect(refused.headers['www-authenticate']).toBe('Bearer');
    expect(refused.headers['x-dstack-proxy-hit']).toBeUndefined(); // Nginx keeps that to itself
    expect((await get('private.gw.test', { token: OUTSIDER })).status).toBe(403);
    expect(seen).toEqual([]);
    const ok = await get('private.gw.test', { token: MEMBER });
    expect(ok.status).toBe(200);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.headers.authorization).toBeUndefined();
    expect(Object.keys(seen[0]!.headers).filter((h) => h.startsWith('x-dstack'))).toEqual([]);
    expect(ok.headers['access-control-allow-origin']).toBe('https://replica.example'); // not a model: its own CORS
    noSiteServed();
  });

  it('a public service gets no check, and its Authorization as the site passes it', async () => {
    seen.length = 0;
    const r = await get('plain.gw.test', { headers: { authorization: 'Bearer x' } });
    expect(r.status).toBe(200);
    expect(seen[0]!.headers.authorization).toBe('Bearer x');
  });

  it('logs a refusal as no replica hit, as the site would', async () => {
    const log = join(t.stateDir, 'logs', 'access.log');
    const lines = await eventually(() => {
      const l = readFileSync(log, 'utf8').split('\n');
      return l.some((x) => x.includes(' private.gw.test 200 ')) ? l : undefined;
    });
    const mine = lines.filter((x) => x.includes(' private.gw.test '));
    expect(mine.filter((x) => / 40[13] /.test(x)).map((x) => x.slice(-2))).toEqual([' 0', ' 0']);
    expect(mine.filter((x) => x.includes(' 200 ')).map((x) => x.slice(-2))).toEqual([' 1']);
  });
});

describe('a service with an OpenAI-format model, before its site is served', () => {
  it("answers a preflight itself with the site's CORS, no token needed, the replica not asked", async () => {
    seen.length = 0;
    for (const host of ['chat.gw.test', 'open-chat.gw.test']) {
      const r = await get(host, { method: 'OPTIONS', headers: { origin: 'https://app.example', 'access-control-request-method': 'POST' } });
      expect(r.status).toBe(204);
      expect(r.headers['access-control-allow-origin']).toBe('*');
      expect(r.headers['access-control-allow-methods']).toBe('GET, POST, PUT, PATCH, DELETE, OPTIONS');
      expect(r.headers['access-control-allow-headers']).toContain('Authorization');
    }
    expect(seen).toEqual([]);
  });

  it("adds the site's CORS to every answer, refusals included, in place of the replica's", async () => {
    const refused = await get('chat.gw.test');
    expect(refused.status).toBe(401);
    expect(refused.headers['access-control-allow-origin']).toBe('*');
    for (const r of [await get('chat.gw.test', { token: MEMBER }), await get('open-chat.gw.test')]) {
      expect(r.status).toBe(200);
      expect(r.headers['access-control-allow-origin']).toBe('*'); // one header, ours
      expect(r.headers['access-control-allow-methods']).toBe('GET, POST, PUT, PATCH, DELETE, OPTIONS');
    }
    // A host without a model gets none of it.
    expect((await get('plain.gw.test')).headers['access-control-allow-methods']).toBeUndefined();
    noSiteServed();
  });
});
