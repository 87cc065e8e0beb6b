// Auth checks through a real Nginx: an auth: true site whose auth_request goes to a fastify app
// with authRoutes, which asks a small fastify app playing dstack's control server.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authRoutes } from '../../src/api/auth-routes.js';
import { bearerToken, createControlServerAuth, type AuthProvider } from '../../src/auth/index.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { API_VERSION, KIND, type ProxyState, type Service } from '../../src/spec/types.js';
import { close, request, startEcho } from '../helpers/http.js';
import { startTestNginx, type TestNginx } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { serveState } from './nginx-site.js';

const MEMBER = 'member-token-0123456789';
const DOMAIN = 'secure.gw.test';

/** dstack's `POST /api/projects/<project>/get`: 200 for members of "main", 403 else, 500 for "boom". */
async function startControlServer(listen: { port: number } | { path: string }) {
  const calls: string[] = [];
  const app = Fastify({ forceCloseConnections: true });
  app.post<{ Params: { project: string } }>('/api/projects/:project/get', async (req, reply) => {
    const auth = req.headers.authorization ?? '';
    calls.push(auth);
    if (auth === 'Bearer boom') return reply.code(500).send({ detail: 'boom' });
    if (auth === 'Bearer hang') return new Promise(() => undefined);
    if (auth === `Bearer ${MEMBER}` && req.params.project === 'main') return { project_name: 'main' };
    return reply.code(403).send({ detail: [{ msg: 'Access denied', code: 'forbidden' }] });
  });
  await app.listen('path' in listen ? { path: listen.path } : { port: listen.port, host: '127.0.0.1' });
  return { app, calls };
}

function service(over: Partial<Service> & { run: string }): Service {
  return {
    project: 'main',
    https: false,
    auth: false,
    clientMaxBodySize: 1 << 20,
    stripPrefix: true,
    rateLimits: [],
    replicas: [],
    ...over,
  };
}

let ng: TestNginx;
let echo: Server;
let ctl: Awaited<ReturnType<typeof startControlServer>>;
let gw: FastifyInstance;
let auth: AuthProvider;
const clock = new FakeClock();
const logLines: string[] = [];

const remote = (headers: Record<string, string> = {}) =>
  request({ port: ng.httpPort, host: DOMAIN, path: '/v1/models', headers, localAddress: '127.0.0.2' });

beforeAll(async () => {
  const [echoPort, ctlPort, gwPort] = (await freePorts(3)) as [number, number, number];
  ng = await startTestNginx();
  echo = await startEcho('replica', { port: echoPort });
  ctl = await startControlServer({ port: ctlPort });
  const logger = pino({ level: 'debug' }, new Writable({ write: (c: Buffer, _e, cb) => (logLines.push(c.toString()), cb()) }));
  auth = createControlServerAuth({ serverUrl: `http://127.0.0.1:${ctlPort}`, clock, ttlMs: 60_000, timeoutMs: 3_000, logger });
  gw = Fastify({ loggerInstance: logger as FastifyBaseLogger });
  await gw.register(authRoutes, { auth });
  await gw.listen({ port: gwPort, host: '127.0.0.1' });
  const state: ProxyState = {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.test/dir' },
      projects: [{ name: 'main' }],
      services: [
        service({
          run: 'secure',
          domain: DOMAIN,
          auth: true,
          replicas: [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: echoPort } }],
        }),
      ],
      entrypoints: [],
    },
  };
  await serveState(ng, state, `http://127.0.0.1:${gwPort}`);
});

afterAll(async () => {
  await gw?.close();
  await auth?.close();
  await ctl?.app.close();
  if (echo) await close(echo);
  await ng?.stop();
});

describe('auth through a real Nginx', () => {
  it('no header → 401 without asking the server', async () => {
    const r = await remote();
    expect(r.status).toBe(401);
    expect(r.headers['www-authenticate']).toBe('Bearer');
    expect(ctl.calls).toEqual([]);
  });

  it('a token that is not a member → 403', async () => {
    expect((await remote({ authorization: 'Bearer stranger' })).status).toBe(403);
    expect(ctl.calls).toEqual(['Bearer stranger']);
  });

  it('a member token → 200 from the replica, which never sees the token', async () => {
    const r = await remote({ authorization: `Bearer ${MEMBER}` });
    expect(r.status).toBe(200);
    const body = JSON.parse(r.body) as { name: string; headers: Record<string, string> };
    expect(body.name).toBe('replica');
    expect(body.headers.authorization).toBeUndefined();
  });

  it('serves a member from cache, asks again after the TTL', async () => {
    const before = ctl.calls.length;
    for (let i = 0; i < 3; i++) expect((await remote({ authorization: `Bearer ${MEMBER}` })).status).toBe(200);
    expect(ctl.calls.length).toBe(before);
    clock.advance(60_001);
    expect((await remote({ authorization: `Bearer ${MEMBER}` })).status).toBe(200);
    expect(ctl.calls.length).toBe(before + 1);
  });

  it('requests from 127.0.0.1 need a token too', async () => {
    const local = await request({ port: ng.httpPort, host: DOMAIN, path: '/v1/models' });
    expect(local.status).toBe(401);
    expect(local.body).not.toContain('replica');
    expect((await remote()).status).toBe(401);
  });

  it('a server error denies the request and is not cached', async () => {
    const before = ctl.calls.length;
    for (let i = 0; i < 2; i++) {
      const r = await remote({ authorization: 'Bearer boom' });
      expect(r.status).toBe(500); // Nginx's answer to an auth_request 503: refused
      expect(r.body).not.toContain('replica');
    }
    expect(ctl.calls.length).toBe(before + 2);
  });

  it('server down → denied; tokens never appear in the logs', async () => {
    await ctl.app.close();
    clock.advance(60_001); // the member's cached answer has expired
    const r = await remote({ authorization: `Bearer ${MEMBER}` });
    expect([401, 403, 200]).not.toContain(r.status);
    expect(r.body).not.toContain('replica');
    expect(logLines.join('')).toContain('unreachable');
    expect(logLines.join('')).not.toContain(MEMBER);
  });
});

describe('createControlServerAuth', () => {
  it('reaches the server over a Unix socket (unix:/path)', async () => {
    const tmp = tmpDir('dp-auth-');
    const path = join(tmp.dir, 'server.sock');
    const srv = await startControlServer({ path });
    const a = createControlServerAuth({ serverUrl: `unix:${path}` });
    try {
      expect(await a.check('main', MEMBER)).toBe('allow');
      expect(await a.check('main', 'nope')).toBe('deny');
      expect(await a.check('other', MEMBER)).toBe('deny');
      // five concurrent checks of a new token ask once
      const b = createControlServerAuth({ serverUrl: `unix:${path}` });
      const before = srv.calls.length;
      expect(await Promise.all(Array.from({ length: 5 }, () => b.check('main', MEMBER)))).toEqual(Array(5).fill('allow'));
      expect(srv.calls.length).toBe(before + 1);
      await b.close();
    } finally {
      await a.close();
      await srv.app.close();
      tmp.cleanup();
    }
  });

  it('a server that does not answer in time → unavailable, asked again next time', async () => {
    const [port] = (await freePorts(1)) as [number];
    const srv = await startControlServer({ port });
    const a = createControlServerAuth({ serverUrl: `http://127.0.0.1:${port}`, timeoutMs: 200 });
    try {
      expect(await a.check('main', 'hang')).toBe('unavailable');
      expect(await a.check('main', 'hang')).toBe('unavailable');
      expect(srv.calls.filter((c) => c === 'Bearer hang').length).toBe(2);
    } finally {
      await a.close();
      await srv.app.close();
    }
  });

  it('refuses a bad server URL at the door', () => {
    for (const url of ['ftp://x', 'unix:relative.sock', 'not a url', 'http://u:p@host']) {
      expect(() => createControlServerAuth({ serverUrl: url }), url).toThrow(/server-url/);
    }
  });

  it.each([
    [undefined, null],
    ['Bearer abc', 'abc'],
    ['bearer  abc ', 'abc'],
    ['Basic abc', null],
    ['Bearer', null],
    ['Bearer a b', null],
  ])('bearerToken(%j) = %j', (h, t) => expect(bearerToken(h)).toBe(t));

  it('the route: malformed header → 401, deny → 403, unavailable → 503', async () => {
    const app = Fastify();
    const decisions = { a: 'deny', b: 'unavailable' } as const;
    await app.register(authRoutes, {
      auth: { check: async (_p, t) => decisions[t as 'a' | 'b'] ?? 'allow', close: async () => undefined },
    });
    const get = (authorization?: string) =>
      app.inject({ method: 'GET', url: '/api/auth/main', headers: authorization ? { authorization } : {} });
    expect((await get('Basic Zm9v')).statusCode).toBe(401);
    expect((await get('Bearer a')).statusCode).toBe(403);
    expect((await get('Bearer b')).statusCode).toBe(503);
    expect((await get('Bearer c')).statusCode).toBe(200);
    await app.close();
  });
});
