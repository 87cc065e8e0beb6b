// The standalone `server-proxy` (the built CLI, as an operator starts it) keeps its management
// routes — PUT/GET /api/v1/state, /api/v1/status, /metrics, /api/stats/collect — from whoever its
// proxied requests come from. The proxy's listener serves them only behind the token (or opened
// explicitly): a load balancer or TLS terminator on the same host makes every client arrive from
// loopback, so the listener's address and the caller's say nothing. Without a token they are off
// there, and --api-port moves them to a loopback listener of their own.
//
// Every address of 127.0.0.0/8 is loopback for the kernel, so "another host" is played by a
// client connecting from 127.0.0.2 to a listener on 0.0.0.0, and "a load balancer on the same
// host" by a TCP relay on 127.0.0.1 in front of the proxy: what reaches the proxy through it
// comes from 127.0.0.1.

import { chmod, writeFile } from 'node:fs/promises';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, spawnCli, type CliProcess } from '../helpers/cli.js';
import { tmpDir } from '../helpers/tmp.js';
import { eventually } from '../helpers/nginx.js';
import { directService, doc, send, type Reply } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

const TOKEN = 'mgmt-token-0123456789abcdef';
const OUTSIDE = '127.0.0.2';

let tmp: { dir: string; cleanup: () => void };
let tokenFile: string;
let replica: TestReplica;
const running: CliProcess[] = [];
const relays: Server[] = [];
let n = 0;

beforeAll(async () => {
  tmp = tmpDir('dp-sp-mgmt-');
  tokenFile = join(tmp.dir, 'token');
  await writeFile(tokenFile, `${TOKEN}\n`);
  await chmod(tokenFile, 0o600);
  replica = await startReplica();
});
afterAll(async () => {
  for (const r of relays) r.close();
  for (const p of running) await p.stop();
  await replica?.close();
  tmp?.cleanup();
});

/** server-proxy on a fresh SQLite file with these extra flags; resolves once it listens. */
async function start(flags: string[]): Promise<{ proc: CliProcess; url: string; apiUrl: string }> {
  const dir = join(tmp.dir, `p${n++}`);
  const proc = spawnCli(['server-proxy', '--db', `sqlite:${dir}.db`, '--state-dir', dir, '--log-level', 'warn', ...flags]);
  running.push(proc);
  const m = await proc.waitFor(/listening on (http:\/\/[^\s,]+)(, management API (?:on (http:\/\/\S+)|off \(.*\)))? \(generation/);
  return { proc, url: m[1]!, apiUrl: m[2] === undefined ? m[1]! : (m[3] ?? 'off') };
}

/** A TCP relay on 127.0.0.1 to `url`'s port, as a load balancer on the same host is; its URL. */
async function relayTo(url: string): Promise<string> {
  const target = Number(new URL(url).port);
  const relay: Server = createServer((client) => {
    const upstream = connect({ host: '127.0.0.1', port: target });
    client.pipe(upstream).pipe(client);
    const end = (): void => {
      client.destroy();
      upstream.destroy();
    };
    client.once('error', end).once('close', end);
    upstream.once('error', end).once('close', end);
  });
  await new Promise<void>((resolve) => relay.listen(0, '0.0.0.0', resolve));
  relays.push(relay);
  return `http://127.0.0.1:${(relay.address() as { port: number }).port}`;
}

const MANAGEMENT = [
  ['PUT', '/api/v1/state'],
  ['PUT', '/api/v1/state?dryRun=true'],
  ['GET', '/api/v1/state'],
  ['GET', '/api/v1/status'],
  ['GET', '/metrics'],
  ['GET', '/api/stats/collect'],
] as const;

/** The same start, expected to be refused. */
async function refused(flags: string[]): Promise<{ code: number; stderr: string }> {
  const dir = join(tmp.dir, `p${n++}`);
  return runCli(['server-proxy', '--db', `sqlite:${dir}.db`, '--state-dir', dir, '--log-level', 'warn', ...flags]);
}

/** 127.0.0.1:<port of url>, reached from `OUTSIDE`. */
function fromOutside(url: string, path: string, o: { method?: string; token?: string; body?: unknown } = {}): Promise<Reply> {
  const port = new URL(url).port;
  return send(`http://127.0.0.1:${port}${path}`, {
    method: o.method ?? 'GET',
    localAddress: OUTSIDE,
    headers: {
      ...(o.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
    },
    ...(o.body !== undefined ? { body: JSON.stringify(o.body) } : {}),
  });
}

const document = (): Record<string, unknown> => doc([directService('test-proj', 'app', replica.port)]);

/** Connecting to host:port is refused (nothing listens there). */
function connectRefused(host: string, port: number, localAddress: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host, port, localAddress });
    s.once('connect', () => {
      s.destroy();
      resolve(false);
    });
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

describe('server-proxy: management routes on the network', () => {
  it('the default (127.0.0.1, no token) behind a same-host relay: management off, 403 to everyone, nothing stored', async () => {
    const { url, apiUrl, proc } = await start(['--port', '0']);
    expect(apiUrl).toBe('off');
    // The start-up warning names the ways to turn it on.
    const warned = proc.output();
    expect(warned).toMatch(/management routes .* are off on the proxy's listener/);
    for (const way of ['--api-token-file', '--api-port', '--insecure-open-api']) expect(warned).toContain(way);
    const relay = await relayTo(url);
    for (const [method, path] of MANAGEMENT) {
      // Through the relay from another address, through it from loopback, and straight to the port.
      for (const [via, from] of [
        [relay, OUTSIDE],
        [relay, '127.0.0.1'],
        [url, '127.0.0.1'],
      ] as const) {
        const r = await send(`${via}${path}`, {
          method,
          localAddress: from,
          ...(method === 'PUT' ? { headers: { 'content-type': 'application/json' }, body: JSON.stringify(document()) } : {}),
        });
        expect(r.status, `${method} ${path} via ${via} from ${from}`).toBe(403);
        expect(r.json()).toMatchObject({ code: 'DP_ERR_MANAGEMENT_OFF', message: expect.stringContaining('--api-port') });
      }
    }
    // Nothing was stored: the service is unknown, on the relay as on the port; the probes answer.
    expect((await send(`${relay}/proxy/services/test-proj/app/echo`, { localAddress: OUTSIDE })).status).toBe(404);
    expect((await send(`${url}/proxy/services/test-proj/app/echo`)).status).toBe(404);
    expect((await send(`${relay}/readyz`, { localAddress: OUTSIDE })).status).toBe(200);
  });

  it('--host 0.0.0.0 without a token starts with management off: 403 from another address', async () => {
    const { url, apiUrl } = await start(['--host', '0.0.0.0', '--port', '0']);
    expect(apiUrl).toBe('off');
    const put = await fromOutside(url, '/api/v1/state', { method: 'PUT', body: document() });
    expect(put.status).toBe(403);
    expect(put.json()).toMatchObject({ code: 'DP_ERR_MANAGEMENT_OFF' });
    expect((await fromOutside(url, '/proxy/services/test-proj/app/echo')).status).toBe(404);
  });

  it('with --api-token-file behind a same-host relay: 401 without the token, 200 and served with it', async () => {
    const { url } = await start(['--port', '0', '--api-token-file', tokenFile]);
    const relay = await relayTo(url);
    const via = (path: string, o: { method?: string; token?: string; body?: unknown } = {}): Promise<Reply> => fromOutside(relay, path, o);
    for (const [method, path] of MANAGEMENT) {
      const r = await via(path, { method, ...(method === 'PUT' ? { body: document() } : {}) });
      expect(r.status, `${method} ${path}`).toBe(401);
    }
    expect((await via('/proxy/services/test-proj/app/echo')).status).toBe(404);
    const ok = await via('/api/v1/state', { method: 'PUT', body: document(), token: TOKEN });
    expect(ok.status, ok.body.toString()).toBe(200);
    const proxied = await eventuallyStatus(() => via('/proxy/services/test-proj/app/echo'), 200);
    expect(proxied.json()).toMatchObject({ method: 'GET' });
  });

  it('refuses --api-host 0.0.0.0 for the management listener without a token, and --api-host alone', async () => {
    const r = await refused(['--port', '0', '--api-port', '0', '--api-host', '0.0.0.0']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('DP_ERR_OPEN_API');
    const alone = await refused(['--port', '0', '--api-host', '127.0.0.1']);
    expect(alone.code).toBe(2);
    expect(alone.stderr).toContain('--api-host needs --api-port');
  });

  it('with --api-token-file on 0.0.0.0: 401 without or with a wrong token on every management route, 200 with it', async () => {
    const { url } = await start(['--host', '0.0.0.0', '--port', '0', '--api-token-file', tokenFile]);
    const put = await fromOutside(url, '/api/v1/state', { method: 'PUT', body: document() });
    expect(put.status).toBe(401);
    expect(put.json()).toMatchObject({ code: 'DP_ERR_UNAUTHORIZED' });
    expect((await fromOutside(url, '/api/v1/state?dryRun=true', { method: 'PUT', body: document() })).status).toBe(401);
    for (const path of ['/api/v1/state', '/api/v1/status', '/metrics', '/api/stats/collect']) {
      expect((await fromOutside(url, path)).status, path).toBe(401);
      expect((await fromOutside(url, path, { token: 'wrong-token-0123456789abc' })).status, path).toBe(401);
    }
    // Nothing was stored: the service is unknown.
    expect((await fromOutside(url, '/proxy/services/test-proj/app/echo')).status).toBe(404);

    const ok = await fromOutside(url, '/api/v1/state', { method: 'PUT', body: document(), token: TOKEN });
    expect(ok.status, ok.body.toString()).toBe(200);
    for (const path of ['/api/v1/state', '/api/v1/status', '/metrics', '/api/stats/collect']) {
      expect((await fromOutside(url, path, { token: TOKEN })).status, path).toBe(200);
    }
    // The data path needs no management token.
    const proxied = await eventuallyStatus(() => fromOutside(url, '/proxy/services/test-proj/app/echo'), 200);
    expect(proxied.json()).toMatchObject({ method: 'GET' });
    expect((await fromOutside(url, '/healthz')).status).toBe(200);
  });

  it('--insecure-open-api serves them open on 0.0.0.0, with a warning', async () => {
    const { url, proc } = await start(['--host', '0.0.0.0', '--port', '0', '--insecure-open-api']);
    expect(proc.output()).toMatch(/open without a token on a non-loopback address/);
    const put = await fromOutside(url, '/api/v1/state', { method: 'PUT', body: document() });
    expect(put.status, put.body.toString()).toBe(200);
  });

  it('--api-port: management on its own loopback listener, the public one answers it 404', async () => {
    const { url, apiUrl } = await start(['--host', '0.0.0.0', '--port', '0', '--api-port', '0']);
    expect(new URL(apiUrl).hostname).toBe('127.0.0.1');
    expect(apiUrl).not.toBe(url);
    // On the public listener the management routes do not exist.
    for (const [method, path] of [
      ['PUT', '/api/v1/state'],
      ['GET', '/api/v1/state'],
      ['GET', '/api/v1/status'],
      ['GET', '/metrics'],
      ['GET', '/api/stats/collect'],
    ] as const) {
      const r = await fromOutside(url, path, method === 'PUT' ? { method, body: document() } : { method });
      expect(r.status, `${method} ${path}`).toBe(404);
    }
    // The management listener binds 127.0.0.1 only: 127.0.0.2 is another address, nothing there.
    expect(await connectRefused(OUTSIDE, Number(new URL(apiUrl).port), OUTSIDE)).toBe(true);
    const put = await send(`${apiUrl}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(document()),
    });
    expect(put.status, put.body.toString()).toBe(200);
    expect((await send(`${apiUrl}/api/v1/status`)).status).toBe(200);
    expect((await send(`${apiUrl}/api/stats/collect`)).status).toBe(200);
    expect((await send(`${apiUrl}/metrics`)).status).toBe(200);
    expect((await send(`${apiUrl}/readyz`)).status).toBe(200);
    // The document written there is served on the public listener.
    const proxied = await eventuallyStatus(() => fromOutside(url, '/proxy/services/test-proj/app/echo'), 200);
    expect(proxied.json()).toMatchObject({ method: 'GET' });
    expect((await fromOutside(url, '/readyz')).status).toBe(200);
  });

  it('--insecure-open-api on loopback serves them open on the proxy port, with a warning', async () => {
    const { url, apiUrl, proc } = await start(['--port', '0', '--insecure-open-api']);
    expect(apiUrl).toBe(url);
    expect(proc.output()).toMatch(/open without a token on the proxy's listener/);
    const put = await send(`${url}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(document()),
    });
    expect(put.status, put.body.toString()).toBe(200);
  });
});

/** Poll until the request answers `status` (the watch hands a new generation over within 1 s). */
function eventuallyStatus(get: () => Promise<Reply>, status: number): Promise<Reply> {
  return eventually(async () => {
    const r = await get();
    return r.status === status ? r : undefined;
  });
}
