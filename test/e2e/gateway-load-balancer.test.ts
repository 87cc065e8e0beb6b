// The gateway behind a cloud load balancer, on its real private Nginx. Loopback has many
// addresses: 127.0.0.2 plays the load balancer (--trusted-proxies 127.0.0.2), 127.0.0.3 a client
// that reaches the gateway directly. From the balancer, X-Forwarded-For and X-Forwarded-Proto
// reach the replicas (which echo what they got) as the client's, and IP rate limits key on the
// forwarded client; from anyone else both headers are replaced. The default server answers
// `GET /` with 200 under --health-check-ok, 404 without. A second gateway with neither option
// shows today's behaviour is kept. Rate limits are 1 request per minute without burst, so a
// client's second request inside the minute is refused.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
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

const LB = '127.0.0.2';
const DIRECT = '127.0.0.3';
const TOKEN = 'lb-member-token-0123456789';
const ECHO = 'echo.gw.test';
const LIMITED = 'limited.gw.test';
const PRIVATE = 'private.gw.test';
const MODELS = 'models.gw.test';
const MODEL = 'lb-model';

let server: ControlServer;
let echo: Server;
let echoPort: number;
let modelReplica: Replica;
let behind: TestGateway; // --trusted-proxies 127.0.0.2 --health-check-ok true
let plain: TestGateway; // neither

function doc(): unknown {
  const d = integrationDoc({
    services: [
      { run: 'echo', domain: ECHO, replicas: [directReplica('echo-r0', echoPort)] },
      { run: 'limited', domain: LIMITED, replicas: [directReplica('limited-r0', echoPort)] },
      { run: 'private', domain: PRIVATE, auth: true, replicas: [directReplica('private-r0', echoPort)] },
      {
        run: 'chat',
        domain: 'chat.gw.test',
        model: { name: MODEL, format: 'openai' },
        replicas: [directReplica('chat-r0', modelReplica.port)],
      },
    ],
    entrypoints: [{ domain: MODELS }],
  }) as { spec: { services: { run: string; rateLimits?: unknown[] }[] } };
  // Only /limited/ is limited: `/` of the same site shows readiness without spending a budget.
  d.spec.services.find((s) => s.run === 'limited')!.rateLimits = [{ prefix: '/limited/', key: { type: 'ipAddress' }, rps: 0.01 }];
  return d;
}

const chatBody = (): string => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }] });

async function ready(t: TestGateway): Promise<void> {
  const answers = async (o: Parameters<typeof call>[0]) => ((await call(o)).status === 200 ? true : undefined);
  for (const host of [ECHO, LIMITED, PRIVATE]) {
    const headers: Record<string, string> = host === PRIVATE ? { authorization: `Bearer ${TOKEN}` } : {};
    await eventually(() => answers({ port: t.httpPort, host, path: '/ready', headers }), 30_000);
  }
  const chat = {
    port: t.httpPort,
    path: '/v1/chat/completions',
    method: 'POST',
    body: chatBody(),
    headers: { 'content-type': 'application/json' },
  };
  await eventually(() => answers({ ...chat, host: 'chat.gw.test' }), 30_000);
}

beforeAll(async () => {
  server = await startControlServer({ main: [TOKEN] });
  echo = await startEcho('replica', { port: 0 });
  echoPort = (echo.address() as AddressInfo).port;
  modelReplica = await startOpenAIReplica();
  // Networks and IPv6 beside the one address in use: the real Nginx has to accept every form.
  behind = await startGatewayWith({
    serverUrl: server.url,
    trustedProxies: `10.0.0.0/16, ${LB}, 2001:db8::/32, ::ffff:192.0.2.0/120`,
    healthCheckOk: 'true',
  });
  plain = await startGatewayWith({ serverUrl: server.url });
  for (const t of [behind, plain]) {
    expect((await putState(t, doc())).status).toBe(200);
    await ready(t);
  }
}, 90_000);

afterAll(async () => {
  await behind?.cleanup();
  await plain?.cleanup();
  if (echo) await close(echo);
  await modelReplica?.close();
  await server?.close();
});

interface Echoed {
  name: string;
  url: string;
  headers: Record<string, string | undefined>;
}

/** A request to `host` on gateway `t` from loopback address `from`; the echo replica's view of it. */
async function via(t: TestGateway, from: string, host: string, headers: Record<string, string> = {}, path = '/x'): Promise<Echoed> {
  const r = await call({ port: t.httpPort, host, path, headers, localAddress: from });
  expect(r.status, r.body).toBe(200);
  return JSON.parse(r.body) as Echoed;
}

const get = (
  t: TestGateway,
  o: { from: string; host: string; path: string; method?: string; headers?: Record<string, string> },
): Promise<Reply> =>
  call({
    port: t.httpPort,
    host: o.host,
    path: o.path,
    localAddress: o.from,
    ...(o.method ? { method: o.method } : {}),
    headers: o.headers ?? {},
  });

describe('from a trusted load balancer', () => {
  it("passes the client's X-Forwarded-For and X-Forwarded-Proto to the replica as the client's", async () => {
    const got = await via(behind, LB, ECHO, { 'x-forwarded-for': '203.0.113.7', 'x-forwarded-proto': 'https' });
    expect(got.headers['x-forwarded-proto']).toBe('https');
    expect(got.headers['x-forwarded-for']).toBe('203.0.113.7');
    expect(got.headers['x-real-ip']).toBe('203.0.113.7');
  });

  it('takes the last address not of a trusted proxy: entries the client wrote itself do not count', async () => {
    const got = await via(behind, LB, ECHO, { 'x-forwarded-for': '198.51.100.1, 203.0.113.7' });
    expect(got.headers['x-real-ip']).toBe('203.0.113.7');
    expect(got.headers['x-forwarded-for']).toBe('203.0.113.7');
    // Two trusted hops (a balancer behind another one): recursive.
    const two = await via(behind, LB, ECHO, { 'x-forwarded-for': `203.0.113.8, ${LB}` });
    expect(two.headers['x-real-ip']).toBe('203.0.113.8');
  });

  it('keeps only http or https (any case, passed on in lower case) as the proto; anything else becomes the connection scheme', async () => {
    expect((await via(behind, LB, ECHO, { 'x-forwarded-proto': 'http' })).headers['x-forwarded-proto']).toBe('http');
    expect((await via(behind, LB, ECHO, { 'x-forwarded-proto': 'HTTPS' })).headers['x-forwarded-proto']).toBe('https');
    for (const bad of ['gopher', 'https, http', 'https;', '']) {
      expect((await via(behind, LB, ECHO, { 'x-forwarded-proto': bad })).headers['x-forwarded-proto'], bad).toBe('http');
    }
    // Without X-Forwarded-For the balancer itself is the client.
    expect((await via(behind, LB, ECHO)).headers['x-real-ip']).toBe(LB);
  });

  it('gives each forwarded client its own rate-limit budget', async () => {
    const hit = (from: string, xff?: string) =>
      get(behind, { from, host: LIMITED, path: '/limited/a', headers: xff ? { 'x-forwarded-for': xff } : {} });
    expect((await hit(LB, '203.0.113.20')).status).toBe(200);
    expect((await hit(LB, '203.0.113.20')).status).toBe(429);
    expect((await hit(LB, '203.0.113.21')).status).toBe(200);
    // A direct client naming a spent address as its X-Forwarded-For is counted as itself.
    expect((await hit(DIRECT, '203.0.113.21')).status).toBe(200);
    expect((await hit(DIRECT, '203.0.113.22')).status).toBe(429);
  });

  it('lets auth_request through for a member: the token check does not depend on the address', async () => {
    const r = await get(behind, {
      from: LB,
      host: PRIVATE,
      path: '/p',
      headers: { authorization: `Bearer ${TOKEN}`, 'x-forwarded-for': '203.0.113.30', 'x-forwarded-proto': 'https' },
    });
    expect(r.status, r.body).toBe(200);
    const got = JSON.parse(r.body) as Echoed;
    expect([got.headers['x-real-ip'], got.headers['x-forwarded-proto'], got.headers.authorization]).toEqual([
      '203.0.113.30',
      'https',
      undefined,
    ]);
    expect((await get(behind, { from: LB, host: PRIVATE, path: '/p', headers: { 'x-forwarded-for': '203.0.113.30' } })).status).toBe(401);
  });

  it("tells the model API the forwarded client, which it passes to the model's replica", async () => {
    const before = modelReplica.received.length;
    const r = await call({
      port: behind.httpPort,
      host: MODELS,
      path: '/chat/completions',
      method: 'POST',
      body: chatBody(),
      headers: {
        authorization: `Bearer ${TOKEN}`,
        'content-type': 'application/json',
        'x-forwarded-for': '203.0.113.40',
        'x-forwarded-proto': 'https',
      },
      localAddress: LB,
    });
    expect(r.status, r.body).toBe(200);
    const got = modelReplica.received[before]!;
    expect(got.headers['x-real-ip']).toBe('203.0.113.40');
    expect(got.headers['x-forwarded-for']).toBe('203.0.113.40');
    expect(got.headers['x-forwarded-proto']).toBe('https');
  });
});

describe('from an untrusted address', () => {
  it('replaces both headers: the connection is the client, its scheme the proto', async () => {
    const got = await via(behind, DIRECT, ECHO, {
      'x-forwarded-for': '203.0.113.7',
      'x-forwarded-proto': 'https',
      'x-real-ip': '203.0.113.7',
    });
    expect(got.headers['x-forwarded-proto']).toBe('http');
    expect(got.headers['x-forwarded-for']).toBe(DIRECT);
    expect(got.headers['x-real-ip']).toBe(DIRECT);
  });

  it('cannot pick its rate-limit bucket with X-Forwarded-For', async () => {
    const hit = (xff: string) => get(behind, { from: '127.0.0.4', host: LIMITED, path: '/limited/b', headers: { 'x-forwarded-for': xff } });
    expect((await hit('203.0.113.50')).status).toBe(200);
    expect((await hit('203.0.113.51')).status).toBe(429);
  });

  it('cannot make the model API believe another client', async () => {
    const before = modelReplica.received.length;
    const r = await call({
      port: behind.httpPort,
      host: MODELS,
      path: '/chat/completions',
      method: 'POST',
      body: chatBody(),
      headers: {
        authorization: `Bearer ${TOKEN}`,
        'content-type': 'application/json',
        'x-forwarded-for': '203.0.113.41',
        'x-forwarded-proto': 'https',
      },
      localAddress: DIRECT,
    });
    expect(r.status, r.body).toBe(200);
    const got = modelReplica.received[before]!;
    expect([got.headers['x-real-ip'], got.headers['x-forwarded-for'], got.headers['x-forwarded-proto']]).toEqual([DIRECT, DIRECT, 'http']);
  });
});

describe('the default server', () => {
  it('answers GET / with 200 under --health-check-ok, whatever the Host (a health check sends the instance address)', async () => {
    for (const host of [`127.0.0.1:${behind.httpPort}`, '10.0.3.17', 'unknown.example']) {
      const r = await get(behind, { from: LB, host, path: '/' });
      expect([r.status, r.body, r.headers['content-type']]).toEqual([200, '{"status":"ok"}', 'application/json']);
    }
    expect((await get(behind, { from: DIRECT, host: '10.0.3.17', path: '/', method: 'HEAD' })).status).toBe(200);
  });

  it('keeps 404 for other paths and methods, and for every path without the option', async () => {
    expect((await get(behind, { from: LB, host: '10.0.3.17', path: '/health' })).status).toBe(404);
    expect((await get(behind, { from: LB, host: '10.0.3.17', path: '/', method: 'POST' })).status).toBe(404);
    expect((await get(plain, { from: LB, host: '10.0.3.17', path: '/' })).status).toBe(404);
  });

  it("does not touch a service's own /", async () => {
    const r = await get(behind, { from: LB, host: ECHO, path: '/' });
    expect([r.status, (JSON.parse(r.body) as Echoed).name]).toEqual([200, 'replica']);
  });
});

describe('without --trusted-proxies', () => {
  it("keeps today's headers: the chain appended to, the proto the connection scheme", async () => {
    const got = await via(plain, LB, ECHO, { 'x-forwarded-for': '203.0.113.7', 'x-forwarded-proto': 'https' });
    expect(got.headers['x-forwarded-proto']).toBe('http');
    expect(got.headers['x-forwarded-for']).toBe(`203.0.113.7, ${LB}`);
    expect(got.headers['x-real-ip']).toBe(LB);
  });

  it('keys rate limits on the connection', async () => {
    const hit = (xff: string) => get(plain, { from: LB, host: LIMITED, path: '/limited/c', headers: { 'x-forwarded-for': xff } });
    expect((await hit('203.0.113.60')).status).toBe(200);
    expect((await hit('203.0.113.61')).status).toBe(429);
  });
});
