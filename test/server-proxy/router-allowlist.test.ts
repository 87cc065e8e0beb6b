// The router allowlist and the per-service read timeout in the in-server proxy, over a real
// replica on 127.0.0.1: through the standalone server proxy (the raw fast path, with the SSH
// loop's data plane, wired from the document) and through fastify's routes (fast path off).
// Allowed paths reach the replica; every other path gets dstack's 403 before any replica is
// asked; a replica pausing 3 s answers 504 on a service with `readTimeout: 1` and in full with the default.

import { createServer, request as httpRequest, type Server } from 'node:http';
import { fastify, type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerServerProxy } from '../../src/server-proxy/plugin.js';
import { emptyState, type Service } from '../../src/spec/types.js';
import { close } from '../helpers/http.js';
import { replicasOf } from '../helpers/replicas.js';
import { directService, doc, send, startHarness, untilStatus, type Harness } from './harness.js';

const ALLOWED = ['/generate', '/generate?stream=true', '/v1/', '/v1/models', '/v1/chat/completions', '/chat/completions', '/v1/%63hat'];
const REFUSED = [
  '/',
  '/health',
  '/v1',
  '/generate/x',
  '/generatex',
  '/chat/completions/',
  '/v2/models',
  '/v1/../admin',
  '/v1/%2e%2e/admin',
  '/%76%31',
];
const REFUSED_BODY = { detail: 'Path is not allowed for this service' };

/** Every request it sees, by target; `/slow` answers after 3 s. */
async function startReplica(): Promise<{ server: Server; port: number; seen: string[] }> {
  const seen: string[] = [];
  const server = createServer((req, res) => {
    seen.push(req.url ?? '');
    const answer = (): void => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ url: req.url }));
    };
    if (req.url === '/slow') setTimeout(answer, 3_000).unref();
    else answer();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as { port: number }).port, seen };
}

/** GET `base + path` with the path sent as written (no URL parsing: `..` and escapes stay). */
function get(base: string, path: string): Promise<{ status: number; json(): unknown }> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: u.hostname, port: u.port, path: `${u.pathname}${path}`, agent: false });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        resolve({ status: res.statusCode ?? 0, json: () => JSON.parse(body) as unknown });
      });
    });
    req.on('error', reject);
    req.end();
  });
}

let replica: Awaited<ReturnType<typeof startReplica>>;
let h: Harness;
let base: string;

beforeAll(async () => {
  replica = await startReplica();
  h = await startHarness();
  await h.put(
    doc([
      directService('test-proj', 'router', replica.port, {
        routerAllowlist: true,
        rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 1000, burst: 1000 }],
      }),
      directService('test-proj', 'short', replica.port, { readTimeout: 1 }),
      directService('test-proj', 'plain', replica.port),
    ]),
  );
  base = `${h.url}/proxy/services/test-proj`;
  await untilStatus(`${base}/router/generate`, 200);
  await untilStatus(`${base}/short/`, 200);
  await untilStatus(`${base}/plain/`, 200);
});

afterAll(async () => {
  await h?.close();
  if (replica) await close(replica.server);
});

describe('the router allowlist, standalone server proxy (fast path)', () => {
  it.each(ALLOWED)('lets %s through', async (path) => {
    const r = await get(`${base}/router`, path);
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ url: path });
  });

  it.each(REFUSED)('refuses %s with 403 before any replica is asked', async (path) => {
    const before = replica.seen.length;
    const r = await get(`${base}/router`, path);
    expect(r.status).toBe(403);
    expect(r.json()).toEqual(REFUSED_BODY);
    expect(replica.seen.length).toBe(before);
  });

  it('refuses a POST with a body and a WebSocket upgrade on a refused path too', async () => {
    const post = await send(`${base}/router/admin`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"a":1}' });
    expect(post.status).toBe(403);
    expect(post.json()).toEqual(REFUSED_BODY);
    const up = await send(`${base}/router/ws`, { headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-key': 'x' } });
    expect(up.status).toBe(403);
    expect(up.json()).toEqual(REFUSED_BODY);
  });

  it('leaves services without the field alone', async () => {
    const r = await send(`${base}/plain/health`);
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ url: '/health' });
  });
});

describe('a per-service read timeout, standalone server proxy', () => {
  it('a replica pausing 3 s on a service with readTimeout 1: the catalog 504', async () => {
    const r = await send(`${base}/short/slow`);
    expect(r.status).toBe(504);
    expect(r.json()).toEqual({ detail: 'Timed out requesting upstream' });
  });

  it('the same pause with the default timeout: the full answer', async () => {
    const r = await send(`${base}/plain/slow`);
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ url: '/slow' });
  });
});

describe('the router allowlist, fastify routes (fast path off)', () => {
  let app: FastifyInstance;
  let url: string;

  beforeAll(async () => {
    const state = emptyState();
    state.spec.services.push({
      project: 'p',
      run: 'r',
      https: false,
      auth: false,
      stripPrefix: true,
      clientMaxBodySize: 0,
      rateLimits: [],
      routerAllowlist: true,
      replicas: [{ id: 'a', appPort: replica.port, direct: { host: '127.0.0.1', port: replica.port } }],
    } satisfies Service);
    const replicas = replicasOf({ 'p/r': [replica.port] });
    app = fastify();
    app.addHook('onClose', () => replicas.close());
    await registerServerProxy(app, { getState: () => state, replicas, authorize: async () => 'allow', fastPath: false });
    await app.listen({ host: '127.0.0.1', port: 0 });
    url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/proxy/services/p/r`;
  });

  afterAll(async () => {
    await app?.close();
  });

  it.each(ALLOWED)('lets %s through', async (path) => {
    const r = await get(url, path);
    expect(r.status).toBe(200);
    expect(r.json()).toEqual({ url: path });
  });

  it.each(REFUSED)('refuses %s with 403', async (path) => {
    const before = replica.seen.length;
    const r = await get(url, path);
    expect(r.status).toBe(403);
    expect(r.json()).toEqual(REFUSED_BODY);
    expect(replica.seen.length).toBe(before);
  });
});
