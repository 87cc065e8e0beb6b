// Rate limits of model services on the gateway's model API, with the real Nginx: the model API
// reaches Nginx on its internal listener carrying the client's address (as the entrypoint site
// saw it, or the API connection's peer) and the headers a limit is keyed on, so every model-API
// user has the bucket they have on the service's own domain. Clients come from distinct loopback
// addresses (Node's localAddress); limits are 1 request per minute without burst, so the second
// request of a client inside the minute is refused.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import {
  call,
  directReplica,
  integrationDoc,
  startControlServer,
  startGatewayWith,
  type ControlServer,
  type Reply,
} from './integration-harness.js';

const TOKEN_A = 'limits-member-a-0123456789';
const TOKEN_B = 'limits-member-b-0123456789';
const ENTRYPOINT = 'models.gw.test';
const BY_IP = 'by-ip.gw.test';
const BY_HEADER = 'by-header.gw.test';

let server: ControlServer;
let replica: Replica;
let t: TestGateway;

beforeAll(async () => {
  server = await startControlServer({ main: [TOKEN_A, TOKEN_B] });
  replica = await startOpenAIReplica();
  t = await startGatewayWith({ serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        run: 'by-ip',
        domain: BY_IP,
        auth: true,
        model: { name: 'ip-model', format: 'openai' },
        replicas: [directReplica('ip-r0', replica.port)],
      },
      {
        run: 'by-header',
        domain: BY_HEADER,
        auth: true,
        model: { name: 'header-model', format: 'openai' },
        replicas: [directReplica('hdr-r0', replica.port)],
      },
    ],
    entrypoints: [{ domain: ENTRYPOINT }],
  }) as { spec: { services: { run: string; rateLimits?: unknown[] }[] } };
  for (const s of doc.spec.services) {
    s.rateLimits = [{ prefix: '/v1', key: s.run === 'by-ip' ? { type: 'ipAddress' } : { type: 'header', header: 'X-Api-Key' }, rps: 0.01 }];
  }
  expect((await putState(t, doc)).status).toBe(200);
  await eventually(
    async () =>
      (await chat('ip-model', { from: '127.0.0.9', token: TOKEN_A, entrypoint: false, path: '/models' })).status === 200 ? true : undefined,
    30_000,
  );
});

afterAll(async () => {
  await t?.cleanup();
  await replica?.close();
  await server?.close();
});

interface ChatOptions {
  from: string;
  token: string;
  /** Through the entrypoint site (Nginx → model API), else straight to the gateway API. */
  entrypoint: boolean;
  headers?: Record<string, string>;
  path?: string;
}

/** A chat completion (or `path` GET) on the model API from the loopback address `from`. */
function chat(model: string, o: ChatOptions): Promise<Reply> {
  const path = o.path ?? '/chat/completions';
  const body = o.path ? undefined : JSON.stringify({ model, messages: [{ role: 'user', content: 'Hi' }] });
  return call({
    port: o.entrypoint ? t.httpPort : t.apiPort,
    host: o.entrypoint ? ENTRYPOINT : '127.0.0.1',
    path: o.entrypoint ? path : `/api/models/main${path}`,
    method: body ? 'POST' : 'GET',
    headers: { authorization: `Bearer ${o.token}`, ...(body ? { 'content-type': 'application/json' } : {}), ...o.headers },
    ...(body ? { body } : {}),
    localAddress: o.from,
  });
}

describe('limits keyed by client address on the model API', () => {
  it('gives each entrypoint client its own bucket, shared with the service domain', async () => {
    expect((await chat('ip-model', { from: '127.0.0.2', token: TOKEN_A, entrypoint: true })).status).toBe(200);
    const again = await chat('ip-model', { from: '127.0.0.2', token: TOKEN_A, entrypoint: true });
    expect(again.status).toBe(429);
    expect(JSON.parse(again.body)).toMatchObject({ error: expect.any(Object) });
    // Another user from another address is not held back by the first one's requests.
    expect((await chat('ip-model', { from: '127.0.0.3', token: TOKEN_B, entrypoint: true })).status).toBe(200);
    // The same client on the service's own domain is in the same bucket.
    const direct = await call({
      port: t.httpPort,
      host: BY_IP,
      path: '/v1/chat/completions',
      method: 'POST',
      body: '{}',
      localAddress: '127.0.0.2',
      headers: { authorization: `Bearer ${TOKEN_A}`, 'content-type': 'application/json' },
    });
    expect(direct.status).toBe(429);
  });

  it('takes a direct API client’s address from its connection', async () => {
    expect((await chat('ip-model', { from: '127.0.0.4', token: TOKEN_A, entrypoint: false })).status).toBe(200);
    expect((await chat('ip-model', { from: '127.0.0.4', token: TOKEN_A, entrypoint: false })).status).toBe(429);
    expect((await chat('ip-model', { from: '127.0.0.5', token: TOKEN_A, entrypoint: false })).status).toBe(200);
  });

  it('lets no client pick its bucket with X-Real-IP, X-Forwarded-For or a guessed entrypoint key', async () => {
    const spoof = { 'x-real-ip': '203.0.113.50', 'x-forwarded-for': '203.0.113.50', 'x-dstack-entrypoint-key': '0'.repeat(64) };
    // 127.0.0.2 and 127.0.0.4 used their request above.
    expect((await chat('ip-model', { from: '127.0.0.2', token: TOKEN_A, entrypoint: true, headers: spoof })).status).toBe(429);
    expect((await chat('ip-model', { from: '127.0.0.4', token: TOKEN_A, entrypoint: false, headers: spoof })).status).toBe(429);
  });

  it('passes the client’s forwarding chain to the replica', async () => {
    const before = replica.received.length;
    const r = await chat('ip-model', {
      from: '127.0.0.6',
      token: TOKEN_A,
      entrypoint: true,
      headers: { 'x-forwarded-for': '198.51.100.7' },
    });
    expect(r.status).toBe(200);
    const got = replica.received[before]!;
    expect(got.headers['x-real-ip']).toBe('127.0.0.6');
    expect(got.headers['x-forwarded-for']).toBe('198.51.100.7, 127.0.0.6');
    expect(got.headers.authorization).toBeUndefined();
  });
});

describe('limits keyed by a header on the model API', () => {
  it('applies per header value', async () => {
    const key = (k: string, from: string) => chat('header-model', { from, token: TOKEN_A, entrypoint: true, headers: { 'x-api-key': k } });
    expect((await key('key-1', '127.0.0.7')).status).toBe(200);
    // Another address does not help: the limit is keyed by the header.
    expect((await key('key-1', '127.0.0.8')).status).toBe(429);
    expect((await key('key-2', '127.0.0.7')).status).toBe(200);
    // Straight to the API as well.
    expect(
      (await chat('header-model', { from: '127.0.0.9', token: TOKEN_A, entrypoint: false, headers: { 'x-api-key': 'key-2' } })).status,
    ).toBe(429);
  });
});
