// The gateway's API listener on loopback without a token is management for this host: what its
// Nginx proxies there from the internet (an entrypoint site's model calls) must reach the model
// API and nothing else. Nginx maps the entrypoint's paths under /api/models/<project>/, and the
// API refuses anything else that carries the entrypoint key Nginx adds — whatever a client made
// of the path.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, putState, siteServed, type TestGateway } from '../helpers/gateway.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import { call, directReplica, integrationDoc, startControlServer, startGatewayWith, type ControlServer } from './integration-harness.js';

const MEMBER = 'model-member-token-0123';
const MODEL = 'acme/Proxied-8B';
const ENTRYPOINT = 'api.gw.test';
const KEY_HEADER = 'x-dstack-entrypoint-key';

let server: ControlServer;
let replica: Replica;
let t: TestGateway;

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  replica = await startOpenAIReplica();
  t = await startGatewayWith({ serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        run: 'llm',
        domain: 'llm.gw.test',
        auth: true,
        model: { name: MODEL, format: 'openai', prefix: '/v1' },
        replicas: [directReplica('llm-r0', replica.port)],
      },
    ],
    entrypoints: [{ domain: ENTRYPOINT }],
  });
  const r = await putState(t, doc);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  await siteServed(t, ENTRYPOINT);
});

afterAll(async () => {
  await t?.cleanup();
  await replica?.close();
  await server?.close();
});

const MANAGEMENT = [
  ['GET', '/api/v1/state'],
  ['PUT', '/api/v1/state'],
  ['GET', '/api/v1/status'],
  ['GET', '/metrics'],
  ['GET', '/api/stats/collect'],
  ['GET', '/api/auth/main'],
] as const;

describe('requests proxied to the gateway API', () => {
  it('a request with the entrypoint key reaches the model API only: 403 on every other route', async () => {
    for (const [method, path] of MANAGEMENT) {
      const r = await call({
        port: t.apiPort,
        host: '127.0.0.1',
        method,
        path,
        headers: { [KEY_HEADER]: 'a'.repeat(64), authorization: `Bearer ${MEMBER}`, 'content-type': 'application/json' },
        ...(method === 'PUT' ? { body: '{}' } : {}),
      });
      expect(r.status, `${method} ${path}: ${r.body}`).toBe(403);
      expect(JSON.parse(r.body)).toMatchObject({ code: 'DP_ERR_FORBIDDEN' });
    }
    const models = await call({
      port: t.apiPort,
      host: '127.0.0.1',
      path: '/api/models/main/models',
      headers: { [KEY_HEADER]: 'a'.repeat(64), authorization: `Bearer ${MEMBER}` },
    });
    expect(models.status, models.body).toBe(200);
    // Without the key, this host's own callers still get management on loopback.
    expect((await api(t, { path: '/api/v1/status' })).status).toBe(200);
  });

  it('through the entrypoint site, no spelling of a path reaches management', async () => {
    const generation = (await api(t, { path: '/api/v1/status' })).json as { generation: number };
    for (const path of [
      '/api/v1/state',
      '/../api/v1/state',
      '/models/../../api/v1/state',
      '/%2e%2e/%2e%2e/api/v1/state',
      '/models/..%2f..%2f..%2fapi%2fv1%2fstate',
      '//api/v1/state',
      '/metrics',
      '/api/stats/collect',
    ]) {
      for (const method of ['GET', 'PUT']) {
        const r = await call({
          port: t.httpPort,
          host: ENTRYPOINT,
          method,
          path,
          headers: { authorization: `Bearer ${MEMBER}`, 'content-type': 'application/json' },
          ...(method === 'PUT' ? { body: '{"apiVersion":"proxy.dstack.ai/v1alpha1","kind":"ProxyState","spec":{}}' } : {}),
        });
        expect(r.status, `${method} ${path}: ${r.body}`).not.toBe(200);
        expect(r.body).not.toContain('ProxyState');
        expect(r.body).not.toContain('dstack_proxy_');
      }
    }
    // Nothing was written, and the entrypoint still serves the model API.
    expect(((await api(t, { path: '/api/v1/status' })).json as { generation: number }).generation).toBe(generation.generation);
    const models = await call({ port: t.httpPort, host: ENTRYPOINT, path: '/models', headers: { authorization: `Bearer ${MEMBER}` } });
    expect(models.status, models.body).toBe(200);
    expect(models.body).toContain(MODEL);
  });
});
