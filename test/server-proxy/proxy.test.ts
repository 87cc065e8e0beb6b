// Black-box HTTP against the standalone server proxy (SQLite, in-process) with a real replica:
// dstack's peer cases (reference Part 3.1) ported, then what we do better.

import { createHash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { Readable } from 'node:stream';
import Fastify, { type FastifyInstance } from 'fastify';
import { WebSocket } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { freePort } from '../helpers/ports.js';
import { directService, doc, send, startHarness, untilStatus, type Harness } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

const MiB = 1024 * 1024;
let h: Harness;
let replica: TestReplica;
let control: FastifyInstance;
let base: string;

beforeAll(async () => {
  replica = await startReplica();
  control = Fastify();
  control.post<{ Params: { project: string } }>('/api/projects/:project/get', async (req, reply) =>
    req.headers.authorization === 'Bearer correct-token' && req.params.project === 'test-proj'
      ? { ok: true }
      : reply.code(403).send({ detail: 'no' }),
  );
  const controlUrl = await control.listen({ host: '127.0.0.1', port: 0 });
  h = await startHarness({ serverUrl: controlUrl, readTimeoutMs: 1_500 });
  base = `${h.url}/proxy/services`;
  const deadPort = await freePort();
  const p = replica.port;
  await h.put(
    doc([
      directService('test-proj', 'httpbin', p),
      directService('test-proj', 'secure', p, { auth: true }),
      directService('test-proj', 'limited', p, {
        rateLimits: [
          { prefix: '/', key: { type: 'ipAddress' }, rps: 0.001, burst: 2 },
          { prefix: '/free', key: { type: 'ipAddress' }, rps: 1000, burst: 1000 },
        ],
      }),
      directService('test-proj', 'small', p, { clientMaxBodySize: 1024 }),
      directService('test-proj', 'dead', deadPort),
      { project: 'test-proj', run: 'empty', auth: false, replicas: [] },
      directService('my-proj', 'my-run', p, { stripPrefix: true }),
      directService('my-proj', 'full-path', p, { stripPrefix: false }),
    ]),
  );
  await untilStatus(`${base}/test-proj/httpbin/echo`, 200);
}, 60_000);

afterAll(async () => {
  await h?.close();
  await replica?.close();
  await control?.close();
}, 30_000);

describe('dstack peer cases', () => {
  it.each(['GET', 'DELETE', 'POST', 'PUT', 'PATCH'])('%s with a 20 MiB body, Host and query kept byte-exact', async (method) => {
    const body = ['GET', 'DELETE'].includes(method) ? undefined : Buffer.alloc(20 * MiB, '.');
    const r = await send(`${base}/test-proj/httpbin/echo?a=b&c=`, {
      method,
      headers: { host: 'test-host:8888', 'user-agent': 'test-ua', connection: 'keep-alive' },
      ...(body ? { body } : {}),
    });
    expect(r.status).toBe(200);
    const e = r.json<{ method: string; url: string; headers: Record<string, string>; bodyBytes: number; sha256: string }>();
    expect(e.method).toBe(method);
    expect(e.url).toBe('/echo?a=b&c=');
    expect(e.headers.host).toBe('test-host:8888');
    expect(e.headers['user-agent']).toBe('test-ua');
    if (body) {
      expect(e.bodyBytes).toBe(body.length);
      expect(e.sha256).toBe(createHash('sha256').update(body).digest('hex'));
    }
  });

  it('HEAD has the Content-Length of GET and no body', async () => {
    const get = await send(`${base}/test-proj/httpbin/cookies`);
    const head = await send(`${base}/test-proj/httpbin/cookies`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(Number(head.headers['content-length'])).toBeGreaterThan(0);
    expect(head.headers['content-length']).toBe(get.headers['content-length']);
    expect(head.body.length).toBe(0);
  });

  it("OPTIONS relays the replica's Allow", async () => {
    const r = await send(`${base}/test-proj/httpbin/get`, { method: 'OPTIONS' });
    expect(r.status).toBe(200);
    expect(new Set(String(r.headers.allow).split(', '))).toEqual(new Set(['HEAD', 'GET', 'OPTIONS']));
    expect(r.body.length).toBe(0);
  });

  it.each([204, 304, 418, 503])('relays status %i', async (code) => {
    expect((await send(`${base}/test-proj/httpbin/status/${code}`)).status).toBe(code);
  });

  it('does not leak cookies between clients', async () => {
    const jar1: string[] = [];
    const jar2: string[] = [];
    const visit = async (jar: string[], path: string): Promise<Record<string, unknown>> => {
      const r = await send(`${base}/test-proj/httpbin${path}`, { headers: jar.length ? { cookie: jar.join('; ') } : {} });
      for (const c of r.headers['set-cookie'] ?? []) jar.push(c.split(';')[0]!);
      return r.status === 200 ? r.json() : { status: r.status };
    };
    expect(await visit(jar1, '/cookies/set?a=1')).toEqual({ status: 302 });
    await visit(jar1, '/cookies/set?b=2');
    await visit(jar2, '/cookies/set?a=3');
    expect(await visit(jar1, '/cookies')).toEqual({ cookies: { a: '1', b: '2' } });
    expect(await visit(jar2, '/cookies')).toEqual({ cookies: { a: '3' } });
    expect(await visit([], '/cookies')).toEqual({ cookies: {} });
  });

  it('504 when the replica does not answer before the read timeout', async () => {
    const r = await send(`${base}/test-proj/httpbin/hang`);
    expect(r.status).toBe(504);
    expect(r.json()).toEqual({ detail: 'Timed out requesting upstream' });
  });

  it('404 for an unknown run, an unknown project, and a service without replicas', async () => {
    for (const [p, r] of [
      ['test-proj', 'unknown'],
      ['unknown', 'test-run'],
      ['test-proj', 'empty'],
    ] as const) {
      const res = await send(`${base}/${p}/${r}/`);
      expect(res.status).toBe(404);
      expect(res.json()).toEqual({ detail: `Service ${p}/${r} not found` });
    }
  });

  it('308 to the trailing slash, query kept, absolute from Host', async () => {
    const r = await send(`${base}/test-proj/httpbin?q=1&x=`, { headers: { host: 'test-host' } });
    expect(r.status).toBe(308);
    expect(r.headers.location).toBe('http://test-host/proxy/services/test-proj/httpbin/?q=1&x=');
    const follow = await send(`${h.url}${new URL(String(r.headers.location)).pathname}?q=1&x=`);
    expect(follow.status).toBe(200);
  });

  it("drops the replica's Server and Date", async () => {
    const r = await send(
      `${base}/test-proj/httpbin/response-headers?X-Custom-Header=1&Server=test&Date=Mon,%2011%20May%202020%2000:00:00%20GMT`,
      { method: 'POST' },
    );
    expect(r.status).toBe(200);
    expect(r.headers['x-custom-header']).toBe('1');
    expect(r.headers.server).toBeUndefined();
    expect(r.headers.date).toBeDefined();
    expect(r.headers.date).not.toContain('2020');
  });

  it.each([
    ['correct-token', 200],
    ['incorrect-token', 403],
    ['', 403],
    [null, 403],
  ] as const)('auth with token %s → %i', async (token, status) => {
    const r = await send(`${base}/test-proj/secure/echo`, { headers: token === null ? {} : { authorization: `Bearer ${token}` } });
    expect(r.status).toBe(status);
    if (status === 403) expect(r.json()).toEqual({ detail: 'Unauthenticated or unauthorized to access project test-proj' });
  });

  it.each([
    ['my-run', '/', '/'],
    ['my-run', '/a/b', '/a/b'],
    ['full-path', '/', '/proxy/services/my-proj/full-path/'],
    ['full-path', '/a/b', '/proxy/services/my-proj/full-path/a/b'],
  ])('strip prefix: %s%s → %s', async (run, path, seen) => {
    const r = await send(`${base}/my-proj/${run}${path}`);
    expect(r.status).toBe(200);
    expect(r.json<{ url: string }>().url).toBe(seen);
  });
});

describe('beyond dstack', () => {
  it('sets X-Forwarded-*, strips hop-by-hop headers, keeps encoded paths byte-exact', async () => {
    const r = await send(`${base}/test-proj/httpbin/echo/a%2Fb%20c?z=1&a=%41`, {
      headers: {
        host: 'svc.example:81',
        connection: 'keep-alive, x-private',
        'x-private': 'hop',
        'keep-alive': 'timeout=5',
        te: 'trailers',
        'proxy-authorization': 'Basic x',
        'x-forwarded-for': '10.0.0.1',
      },
    });
    const e = r.json<{ url: string; headers: Record<string, string> }>();
    expect(e.url).toBe('/echo/a%2Fb%20c?z=1&a=%41');
    expect(e.headers['x-forwarded-for']).toBe('10.0.0.1, 127.0.0.1');
    expect(e.headers['x-real-ip']).toBe('127.0.0.1');
    expect(e.headers['x-forwarded-proto']).toBe('http');
    expect(e.headers['x-forwarded-host']).toBe('svc.example:81');
    for (const hop of ['x-private', 'keep-alive', 'te', 'proxy-authorization', 'upgrade']) expect(e.headers[hop]).toBeUndefined();
    expect(e.headers.connection ?? 'keep-alive').toBe('keep-alive'); // the client's list is not forwarded
  });

  it('does not pass Authorization to a proxy-auth service, does to a public one', async () => {
    const secure = await send(`${base}/test-proj/secure/echo`, { headers: { authorization: 'Bearer correct-token' } });
    expect(secure.json<{ headers: Record<string, string> }>().headers.authorization).toBeUndefined();
    const open = await send(`${base}/test-proj/httpbin/echo`, { headers: { authorization: 'Bearer app-token' } });
    expect(open.json<{ headers: Record<string, string> }>().headers.authorization).toBe('Bearer app-token');
  });

  it('413 above clientMaxBodySize, by Content-Length and by counting a chunked body', async () => {
    const declared = await send(`${base}/test-proj/small/echo`, { method: 'POST', body: Buffer.alloc(2048) });
    expect(declared.status).toBe(413);
    expect(declared.json<{ detail: string }>().detail).toMatch(/larger than 1024 bytes/);
    const chunked = await send(`${base}/test-proj/small/echo`, {
      method: 'POST',
      body: Readable.from([Buffer.alloc(600), Buffer.alloc(600)]),
    });
    expect(chunked.status).toBe(413);
    const fits = await send(`${base}/test-proj/small/echo`, {
      method: 'POST',
      body: Readable.from([Buffer.alloc(500), Buffer.alloc(500)]),
    });
    expect(fits.status).toBe(200);
    expect(fits.json<{ bodyBytes: number }>().bodyBytes).toBe(1000);
  });

  it('429 past the rate limit (burst 2: three pass), longest prefix wins', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await send(`${base}/test-proj/limited/x`)).status);
    expect(statuses).toEqual([200, 200, 200, 429]);
    const r = await send(`${base}/test-proj/limited/x`);
    expect(r.json()).toEqual({ detail: 'Too many requests' });
    expect((await send(`${base}/test-proj/limited/free/y`)).status).toBe(200);
  });

  it('502 when the replica refuses or resets', async () => {
    const dead = await send(`${base}/test-proj/dead/`);
    expect(dead.status).toBe(502);
    expect(dead.json()).toEqual({ detail: 'Error requesting upstream' });
    const reset = await send(`${base}/test-proj/httpbin/reset`);
    expect(reset.status).toBe(502);
  });

  it('relays an SSE stream chunk by chunk', async () => {
    const chunks: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest(`${base}/test-proj/httpbin/sse`, (res) => {
        expect(res.headers['content-type']).toBe('text/event-stream');
        res.setEncoding('utf8');
        res.on('data', (c: string) => {
          chunks.push(c);
          if (chunks.length === 1) replica.release(); // the 2nd chunk exists only after the 1st arrived
        });
        res.on('end', resolve);
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
    expect(chunks.join('')).toBe('data: 1\n\ndata: 2\n\n');
    expect(chunks[0]).toBe('data: 1\n\n');
  });

  it('proxies a WebSocket (echo), with the same path rules', async () => {
    const ws = new WebSocket(`${base.replace('http:', 'ws:')}/test-proj/httpbin/ws?x=1`);
    const got = await new Promise<string>((resolve, reject) => {
      ws.onopen = () => ws.send('hello over the proxy');
      ws.onmessage = (ev) => resolve(String(ev.data));
      ws.onerror = () => reject(new Error('websocket error'));
    });
    expect(got).toBe('hello over the proxy');
    ws.close();
    expect(replica.seen).toContain('/ws?x=1');
  });

  it('refuses a WebSocket to an auth service without a token (403) and to an unknown one (404)', async () => {
    const status = (url: string): Promise<number> =>
      new Promise((resolve, reject) => {
        const req = httpRequest(url, {
          headers: {
            connection: 'Upgrade',
            upgrade: 'websocket',
            'sec-websocket-key': 'dGhlIHNhbXBsZSBub25jZQ==',
            'sec-websocket-version': '13',
          },
        });
        req.on('response', (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        });
        req.on('upgrade', (res, socket) => {
          socket.destroy();
          resolve(res.statusCode ?? 0);
        });
        req.on('error', reject);
        req.end();
      });
    expect(await status(`${base}/test-proj/secure/ws`)).toBe(403);
    expect(await status(`${base}/test-proj/nope/ws`)).toBe(404);
    expect(await status(`${base}/test-proj/httpbin/ws`)).toBe(101);
  });

  it('stats: N requests → collect counts N', async () => {
    const before = h.proxy.proxy.stats.frames.get('my-proj/my-run')?.totalRequests ?? 0;
    const n = 7;
    for (let i = 0; i < n; i++) await send(`${base}/my-proj/my-run/s`);
    const r = await send(`${h.apiUrl}/api/stats/collect`);
    const entry = r
      .json<{ project_name: string; run_name: string; stats: Record<string, { requests: number; request_time: number }> }[]>()
      .find((s) => s.run_name === 'my-run');
    expect(entry?.project_name).toBe('my-proj');
    expect(entry!.stats['300']!.requests - before).toBe(n);
    expect(entry!.stats['30']!.requests).toBeGreaterThanOrEqual(n);
    expect(Object.keys(entry!.stats)).toEqual(['30', '60', '300']);
  });

  it('serves state, status with store health, healthz and readyz', async () => {
    const s = await send(`${h.apiUrl}/api/v1/state`);
    expect(s.status).toBe(200);
    expect(s.json<{ metadata: { generation: number } }>().metadata.generation).toBe(1);
    const st = await send(`${h.apiUrl}/api/v1/status`);
    expect(st.json<{ store: { kind: string; generation: number }; ready: boolean }>()).toMatchObject({
      ready: true,
      store: { kind: 'sqlite', generation: 1 },
    });
    expect((await send(`${h.url}/healthz`)).status).toBe(200);
    expect((await send(`${h.url}/readyz`)).status).toBe(200);
  });

  it('serves a new generation: a removed service is 404 at once, an added one within 1 s', async () => {
    const current = await send(`${h.apiUrl}/api/v1/state`);
    const d = current.json<{ spec: { services: Record<string, unknown>[] } }>();
    const services = d.spec.services.filter((s) => s.run !== 'my-run');
    services.push(directService('my-proj', 'new-run', replica.port));
    await h.put(doc(services));
    expect((await send(`${base}/my-proj/my-run/`)).status).toBe(404);
    await eventually(async () => ((await send(`${base}/my-proj/new-run/`)).status === 200 ? true : undefined), 1_000);
  });
});
