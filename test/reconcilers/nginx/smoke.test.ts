// The rendered config on a real Nginx: Host routing to a direct upstream and to a Unix socket,
// auth_request for every TCP client (127.0.0.1 included) and none on the internal listener,
// HTTPS redirect, ACME webroot, rate limits, CORS, WebSocket upgrade, 503 without replicas, and
// what $dstack_replica_hit logs.

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyFiles, diffFiles, readOwned } from '../../../src/reconcilers/nginx/apply.js';
import { renderAll } from '../../../src/reconcilers/nginx/render.js';
import { buildViews, directUpstream } from '../../../src/reconcilers/nginx/view.js';
import { close, request, startEcho } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { freePorts } from '../../helpers/ports.js';
import { startTcpRelay } from '../../helpers/tcp-relay.js';
import { sampleState, service } from './fixtures.js';

const REMOTE = '127.0.0.2'; // a client address other than the gateway host's own
let internalSocket: string;

/** A request on the internal listener, as the gateway's model API sends it. */
function internal(o: { host: string; path: string; headers?: Record<string, string> }): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ socketPath: internalSocket, path: o.path, headers: { host: o.host, ...o.headers }, agent: false });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end();
  });
}

let ng: TestNginx;
let backend: Server;
let socketBackend: Server;
let authApi: Server;
let ca: string;
const authCalls: { authorization: string | undefined; url: string | undefined }[] = [];

beforeAll(async () => {
  ng = await startTestNginx();
  const [backendPort, apiPort] = (await freePorts(2)) as [number, number];
  backend = await startEcho('direct', { port: backendPort });
  const sock = join(ng.dir, 'svc.sock');
  socketBackend = await startEcho('socket', { path: sock });
  // Stand-in for the gateway's GET /api/auth/:project: only "Bearer good" passes.
  authApi = createServer((req, res) => {
    authCalls.push({ authorization: req.headers.authorization, url: req.url });
    res.statusCode = req.headers.authorization === 'Bearer good' ? 200 : 401;
    res.end();
  });
  await new Promise<void>((r) => authApi.listen(apiPort, '127.0.0.1', r));

  const certDir = join(ng.dir, 'certs');
  await mkdir(certDir, { recursive: true });
  await execa('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:P-256',
    '-nodes',
    '-days',
    '2',
    '-keyout',
    join(certDir, 'key.pem'),
    '-out',
    join(certDir, 'cert.pem'),
    '-subj',
    '/CN=llama-8b.gw.test',
    '-addext',
    'subjectAltName=DNS:llama-8b.gw.test',
  ]);
  ca = await readFile(join(certDir, 'cert.pem'), 'utf8');
  await mkdir(join(ng.acmeWebroot, '.well-known/acme-challenge'), { recursive: true });
  await writeFile(join(ng.acmeWebroot, '.well-known/acme-challenge/tok'), 'challenge-ok');

  internalSocket = join(ng.dir, 'internal', 'nginx.sock');
  await mkdir(join(ng.dir, 'internal'), { mode: 0o700 });
  const state = sampleState(backendPort);
  state.spec.services.push(service({ run: 'sock', domain: 'sock.gw.test', replicas: [] }));
  const views = buildViews(state, {
    httpPort: ng.httpPort,
    httpsPort: ng.httpsPort,
    apiUrl: `http://127.0.0.1:${apiPort}`,
    acmeWebroot: ng.acmeWebroot,
    accessLogPath: ng.accessLogPath,
    certFor: (d) => (d === 'llama-8b.gw.test' ? { certPath: join(certDir, 'cert.pem'), keyPath: join(certDir, 'key.pem') } : null),
    upstreamFor: (s) => (s.run === 'sock' ? { kind: 'socket', path: sock } : directUpstream(s)),
    internalSocket,
  });
  const changes = diffFiles(renderAll(views), await readOwned(ng.paths.confDir));
  const r = await applyFiles({ changes, sitesDir: ng.paths.confDir, mainConfPath: ng.paths.confPath, test: ng.test, reload: ng.reload });
  expect(r.heldBack).toEqual([]);
  expect(r.reloaded).toBe(true);
});

afterAll(async () => {
  await ng?.stop();
  for (const s of [backend, socketBackend, authApi]) if (s) await close(s);
});

type Echo = { name: string; url: string; headers: Record<string, string | undefined> };

describe('routing', () => {
  it('routes by Host to the direct upstream, with forwarded headers', async () => {
    const r = await request({ port: ng.httpPort, host: 'plain.gw.test', path: '/a?b=1', localAddress: REMOTE });
    expect(r.status).toBe(200);
    const echo = JSON.parse(r.body) as Echo;
    expect(echo).toMatchObject({ name: 'direct', url: '/a?b=1' });
    expect(echo.headers).toMatchObject({
      host: 'plain.gw.test',
      'x-real-ip': REMOTE,
      'x-forwarded-for': REMOTE,
      'x-forwarded-proto': 'http',
    });
    expect(echo.headers.connection).toBeUndefined(); // keepalive upstream: Connection ""
  });

  it('routes to a Unix-socket upstream', async () => {
    const r = await request({ port: ng.httpPort, host: 'sock.gw.test' });
    expect(JSON.parse(r.body)).toMatchObject({ name: 'socket', headers: { host: 'sock.gw.test' } });
  });

  it('answers 404 for unknown hosts and serves ACME challenges from the webroot', async () => {
    expect((await request({ port: ng.httpPort, host: 'nope.gw.test' })).status).toBe(404);
    const acme = await request({ port: ng.httpPort, host: 'nope.gw.test', path: '/.well-known/acme-challenge/tok' });
    expect(acme).toMatchObject({ status: 200, body: 'challenge-ok' });
  });

  it('answers 503 with a JSON detail when a service has no replicas', async () => {
    const r = await request({ port: ng.httpPort, host: 'empty.gw.test' });
    expect(r.status).toBe(503);
    expect(r.headers['content-type']).toBe('application/json');
    expect(JSON.parse(r.body)).toEqual({ detail: 'Service main/empty has no ready replica' });
  });

  it('passes WebSocket upgrades', async () => {
    const port = ng.httpPort;
    const upgraded = await new Promise<string | undefined>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port, headers: { host: 'plain.gw.test', connection: 'Upgrade', upgrade: 'websocket' } });
      req.on('upgrade', (res, socket) => {
        socket.destroy();
        resolve(res.headers['x-echo'] as string | undefined);
      });
      req.on('response', (res) => reject(new Error(`no upgrade: ${res.statusCode}`)));
      req.on('error', reject);
      req.end();
    });
    expect(upgraded).toBe('direct');
  });
});

describe('TLS, redirect and auth', () => {
  const https = (o: { path?: string; headers?: Record<string, string>; method?: string }) =>
    request({ port: ng.httpsPort, host: 'llama-8b.gw.test', ca, localAddress: REMOTE, ...o });

  it('redirects HTTP to HTTPS, from 127.0.0.1 too, but not ACME challenges nor the internal listener', async () => {
    const r = await request({ port: ng.httpPort, host: 'llama-8b.gw.test', path: '/x?y=1', localAddress: REMOTE });
    expect(r.status).toBe(301);
    expect(r.headers.location).toBe(`https://llama-8b.gw.test:${ng.httpsPort}/x?y=1`);
    const acme = await request({
      port: ng.httpPort,
      host: 'llama-8b.gw.test',
      path: '/.well-known/acme-challenge/tok',
      localAddress: REMOTE,
    });
    expect(acme.body).toBe('challenge-ok');
    const local = await request({ port: ng.httpPort, host: 'llama-8b.gw.test', path: '/local' });
    expect(local.status).toBe(301);
    expect((await internal({ host: 'llama-8b.gw.test', path: '/internal-http' })).status).toBe(200);
  });

  it('requires a token from remote clients (auth_request) and strips it toward the replica', async () => {
    expect((await https({ path: '/no-token' })).status).toBe(401);
    expect((await https({ path: '/bad', headers: { authorization: 'Bearer bad' } })).status).toBe(401);
    const ok = await https({ path: '/good', headers: { authorization: 'Bearer good' } });
    expect(ok.status).toBe(200);
    const echo = JSON.parse(ok.body) as Echo;
    expect(echo.headers.authorization).toBeUndefined();
    expect(echo.headers['x-forwarded-proto']).toBe('https');
    expect(authCalls.at(-1)).toEqual({ authorization: 'Bearer good', url: '/api/auth/main' });
  });

  it('requires a token from 127.0.0.1 like from anywhere else', async () => {
    const r = await request({ port: ng.httpsPort, host: 'llama-8b.gw.test', ca, path: '/from-loopback' });
    expect(r.status).toBe(401);
  });

  it('lets the internal listener through without a token, with the client address from X-Real-IP', async () => {
    const before = authCalls.length;
    const r = await internal({
      host: 'llama-8b.gw.test',
      path: '/from-gateway',
      headers: { 'x-real-ip': '192.0.2.7', 'x-forwarded-for': '198.51.100.1, 192.0.2.7', authorization: 'Bearer leaked' },
    });
    expect(r.status).toBe(200);
    expect(authCalls.length).toBe(before); // no auth subrequest at all
    const echo = JSON.parse(r.body) as Echo;
    expect(echo.headers).toMatchObject({ 'x-real-ip': '192.0.2.7', 'x-forwarded-for': '198.51.100.1, 192.0.2.7' });
    expect(echo.headers.authorization).toBeUndefined();
  });

  it('gives a client relayed from 127.0.0.1 (a local TLS terminator) the redirect and 401 without a token', async () => {
    const plain = await startTcpRelay(ng.httpPort);
    const tls = await startTcpRelay(ng.httpsPort);
    try {
      const r = await request({ port: plain.port, host: 'llama-8b.gw.test', path: '/relayed', localAddress: REMOTE });
      expect(r.status).toBe(301);
      const before = authCalls.length;
      const t = await request({ port: tls.port, host: 'llama-8b.gw.test', ca, path: '/relayed', localAddress: REMOTE });
      expect(t.status).toBe(401);
      expect(authCalls.length).toBe(before + 1);
    } finally {
      await plain.close();
      await tls.close();
    }
  });

  it('does not take X-Real-IP from TCP clients', async () => {
    const r = await request({ port: ng.httpPort, host: 'plain.gw.test', localAddress: REMOTE, headers: { 'x-real-ip': '192.0.2.9' } });
    expect((JSON.parse(r.body) as Echo).headers['x-real-ip']).toBe(REMOTE);
  });

  it('answers CORS preflight with 204 and adds CORS headers to replies', async () => {
    const pre = await https({ method: 'OPTIONS', path: '/v1/chat/completions' });
    expect(pre.status).toBe(204);
    expect(pre.headers['access-control-allow-origin']).toBe('*');
    const ok = await https({ path: '/v1/models', headers: { authorization: 'Bearer good' } });
    expect(ok.headers['access-control-allow-origin']).toBe('*');
    expect(ok.headers['access-control-allow-methods']).toContain('POST');
  });

  it('rate-limits per prefix with 429 (longest prefix wins)', async () => {
    // /v1/chat: header key X-Api-Key at 30r/m without burst → the second request is rejected.
    const h = { authorization: 'Bearer good', 'x-api-key': 'k1' };
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) statuses.push((await https({ path: '/v1/chat/completions', headers: h })).status);
    expect(statuses[0]).toBe(200);
    expect(statuses.slice(1)).toContain(429);
  });
});

describe('access log', () => {
  it('logs $dstack_replica_hit 1 only for requests that reached the replica location', async () => {
    const lines = await eventually(async () => {
      const t = await readFile(ng.accessLogPath, 'utf8');
      return t.includes(' 429 ') && t.includes(' 503 ') ? t.trim().split('\n') : undefined;
    });
    const hitBy = (host: string, status: number) =>
      new Set(
        lines
          .map((l) => l.split(' '))
          .filter((f) => f[1] === host && f[2] === String(status))
          .map((f) => f[4]),
      );
    expect(lines[0]).toMatch(/^\d{4}-\d\d-\d\dT\S+ \S+ \d{3} \d+\.\d{3} [01]$/);
    expect(hitBy('plain.gw.test', 200)).toEqual(new Set(['1']));
    const llama200 = lines.filter((l) => / llama-8b\.gw\.test 200 /.test(l));
    expect(llama200.filter((l) => l.endsWith(' 0'))).toHaveLength(1); // the ACME challenge, served from disk
    expect(llama200.filter((l) => l.endsWith(' 1')).length).toBeGreaterThanOrEqual(4);
    expect(hitBy('llama-8b.gw.test', 301)).toEqual(new Set(['0']));
    expect(hitBy('llama-8b.gw.test', 401)).toEqual(new Set(['0']));
    expect(hitBy('llama-8b.gw.test', 429)).toEqual(new Set(['0']));
    expect(hitBy('llama-8b.gw.test', 204)).toEqual(new Set(['0']));
    expect(hitBy('empty.gw.test', 503)).toEqual(new Set(['1'])); // demand on a scaled-to-zero service counts
  });
});
