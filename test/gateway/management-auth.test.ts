// The gateway (the built CLI, as an operator starts it) keeps management off the network: a
// tokenless API on a non-loopback --api-host is refused at start; with --api-token-file the
// token guards /api/v1/*, /metrics and /api/stats/collect, while Nginx's auth_request target
// /api/auth/:project and the data path keep working without it.
//
// Every address of 127.0.0.0/8 is loopback for the kernel: "another host" is a client that
// connects from 127.0.0.2 to the API listening on 0.0.0.0.

import { existsSync } from 'node:fs';
import { chmod, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, directReplica, integrationDoc, startControlServer, type ControlServer, type Reply } from '../e2e/integration-harness.js';
import { runCli, spawnCli, type CliProcess } from '../helpers/cli.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

const TOKEN = 'gw-mgmt-token-0123456789abcdef';
const MEMBER = 'member-token-0123456789';
const OUTSIDE = '127.0.0.2';
const DOMAIN = 'private.gw.test';

let tmp: { dir: string; cleanup: () => void };
let tokenFile: string;
let control: ControlServer;
let echo: Server;
let echoPort: number;
const running: CliProcess[] = [];
let n = 0;

beforeAll(async () => {
  tmp = tmpDir('dp-gw-mgmt-');
  tokenFile = join(tmp.dir, 'token');
  await writeFile(tokenFile, `${TOKEN}\n`);
  await chmod(tokenFile, 0o600);
  control = await startControlServer({ main: [MEMBER] });
  [echoPort] = (await freePorts(1)) as [number];
  echo = await startEcho('private', { port: echoPort });
});
afterAll(async () => {
  for (const p of running) await p.stop();
  await control?.close();
  if (echo) await close(echo);
  tmp?.cleanup();
});

interface Started {
  proc: CliProcess;
  apiPort: number;
  httpPort: number;
  stateDir: string;
}

async function gatewayFlags(extra: string[]): Promise<{ args: string[]; apiPort: number; httpPort: number; stateDir: string }> {
  const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
  const stateDir = join(tmp.dir, `gw${n++}`);
  const args = [
    'gateway',
    '--state-dir',
    stateDir,
    '--api-port',
    String(apiPort),
    '--http-port',
    String(httpPort),
    '--https-port',
    String(httpsPort),
    '--listen-host',
    '127.0.0.1',
    '--server-url',
    control.url,
    '--resync-interval',
    '3600',
    '--log-level',
    'warn',
    ...extra,
  ];
  return { args, apiPort, httpPort, stateDir };
}

async function start(extra: string[]): Promise<Started> {
  const { args, apiPort, httpPort, stateDir } = await gatewayFlags(extra);
  const proc = spawnCli(args);
  running.push(proc);
  await proc.waitFor(/API on http:\/\/\S+/);
  return { proc, apiPort, httpPort, stateDir };
}

/** A call to the API on 127.0.0.1:<port> from OUTSIDE. */
function api(port: number, path: string, o: { method?: string; token?: string; body?: unknown } = {}): Promise<Reply> {
  return call({
    port,
    host: '127.0.0.1',
    path,
    method: o.method ?? 'GET',
    localAddress: OUTSIDE,
    headers: {
      ...(o.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
    },
    ...(o.body !== undefined ? { body: JSON.stringify(o.body) } : {}),
  });
}

const document = (): Record<string, unknown> =>
  integrationDoc({ services: [{ run: 'private', domain: DOMAIN, auth: true, replicas: [directReplica('private-r0', echoPort)] }] });

describe('gateway: the management API beyond loopback', () => {
  it('refuses --api-host 0.0.0.0 without a token before touching anything', async () => {
    const { args, apiPort, stateDir } = await gatewayFlags(['--api-host', '0.0.0.0']);
    const r = await runCli(args);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('DP_ERR_OPEN_API');
    expect(r.stderr).toContain('--api-token-file');
    expect(r.stderr).toContain('--insecure-open-api true');
    // No state dir, no Nginx, no listener.
    expect(existsSync(stateDir)).toBe(false);
    await expect(api(apiPort, '/healthz')).rejects.toMatchObject({ code: 'ECONNREFUSED' });
  });

  it('with --api-token-file on 0.0.0.0: /api/v1/*, /metrics, /api/stats/collect need the token; auth_request does not', async () => {
    const g = await start(['--api-host', '0.0.0.0', '--api-token-file', tokenFile]);
    const denied = await api(g.apiPort, '/api/v1/state', { method: 'PUT', body: document() });
    expect(denied.status).toBe(401);
    expect(JSON.parse(denied.body)).toMatchObject({ code: 'DP_ERR_UNAUTHORIZED' });
    for (const path of ['/api/v1/state', '/api/v1/status', '/metrics', '/api/stats/collect']) {
      const none = await api(g.apiPort, path);
      expect(none.status, path).toBe(401);
      expect(none.body, path).not.toContain('dstack_proxy_');
      expect((await api(g.apiPort, path, { token: 'wrong-token-0123456789abcdef' })).status, path).toBe(401);
    }
    expect((await api(g.apiPort, '/healthz')).status).toBe(200);
    expect((await api(g.apiPort, '/readyz')).status).toBe(200);
    // Nothing was applied.
    expect(existsSync(join(g.stateDir, 'nginx', 'sites', `${DOMAIN}.conf`))).toBe(false);

    const ok = await api(g.apiPort, '/api/v1/state', { method: 'PUT', body: document(), token: TOKEN });
    expect(ok.status, ok.body).toBe(200);
    const metrics = await api(g.apiPort, '/metrics', { token: TOKEN });
    expect(metrics.status).toBe(200);
    expect(metrics.body).toContain('dstack_proxy_document_generation');
    expect((await api(g.apiPort, '/api/stats/collect', { token: TOKEN })).status).toBe(200);

    // The status page: a browser is asked for Basic credentials (the token as password), which
    // its own requests then carry to /api/v1/status.
    const basic = (password: string): Record<string, string> => ({
      authorization: `Basic ${Buffer.from(`operator:${password}`).toString('base64')}`,
    });
    const page = (headers: Record<string, string> = {}): Promise<Reply> =>
      call({ port: g.apiPort, host: '127.0.0.1', path: '/status', localAddress: OUTSIDE, headers });
    const asked = await page();
    expect(asked.status).toBe(401);
    expect(asked.headers['www-authenticate']).toBe('Basic realm="dstack-proxy", charset="UTF-8"');
    expect((await page(basic('wrong-token-0123456789abcdef'))).status).toBe(401);
    const shown = await page(basic(TOKEN));
    expect(shown.status).toBe(200);
    expect(shown.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(shown.headers['content-security-policy']).toMatch(/^default-src 'none'; connect-src 'self'; script-src 'sha256-/);
    const status = await call({ port: g.apiPort, host: '127.0.0.1', path: '/api/v1/status', localAddress: OUTSIDE, headers: basic(TOKEN) });
    expect(status.status).toBe(200);

    // The data path: Nginx asks /api/auth/main (no management token) and lets a member through.
    const site = (token?: string): Promise<Reply> =>
      call({
        port: g.httpPort,
        host: DOMAIN,
        path: '/data',
        localAddress: OUTSIDE,
        ...(token ? { headers: { authorization: `Bearer ${token}` } } : {}),
      });
    // Until the reload's old workers stop accepting, a connection may still meet the previous
    // configuration (no site yet: the default server's 404); wait each answer past that.
    const served = (token?: string): Promise<Reply> =>
      eventually(async () => {
        const r = await site(token);
        return r.status === 404 ? undefined : r;
      });
    const member = await served(MEMBER);
    expect(member.status, member.body).toBe(200);
    expect(JSON.parse(member.body)).toMatchObject({ name: 'private' });
    const anon = await served();
    expect(anon.status, anon.body).toBe(401);
    expect((await served('not-a-member-0123456789')).status).toBe(403);
    expect(control.calls).toContainEqual({ project: 'main', token: MEMBER });
  });

  it('--insecure-open-api true serves a tokenless API on 0.0.0.0, with a warning', async () => {
    const g = await start(['--api-host', '0.0.0.0', '--insecure-open-api', 'true']);
    expect(g.proc.output()).toMatch(/open without a token on a non-loopback address/);
    expect((await api(g.apiPort, '/api/v1/status')).status).toBe(200);
    expect((await api(g.apiPort, '/metrics')).status).toBe(200);
  });
});
