// A new service is served before the reload that brings its own site in, against the real
// private Nginx: a reload right after another (the one at start) waits out the minimum
// interval, 15 s here, and meanwhile our default server relays by Host to the data plane. Only
// a service whose site the relay can stand in for is served that way (auth: its token checked by
// the default server; a model: its CORS); one with rate limits waits for its site (404, as an
// unknown host). An unknown host still gets Nginx's own 404, logged
// nowhere; a service's requests through the default server are in the access log the stats
// read.

import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, gatewayDoc, startTestGateway, type SvcInput, type TestGateway } from '../helpers/gateway.js';
import { request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';

let echo: Server;
let echoPort: number;
let t: TestGateway;

beforeAll(async () => {
  [echoPort] = (await freePorts(1)) as [number];
  echo = await startEcho('echo', { port: echoPort });
  t = await startTestGateway({ deps: { nginxLoop: { minReloadIntervalMs: 15_000 } } });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await new Promise<void>((r) => (echo ? echo.close(() => r()) : r()));
});

const NGINX_404 = /<center><h1>404 Not Found<\/h1><\/center>\s*<hr><center>nginx<\/center>/;

function get(host: string, path = '/'): ReturnType<typeof request> {
  return request({ port: t.httpPort, host, path, localAddress: '127.0.0.2' });
}

/** The Nginx loop's Ready condition of a site: how we know it is not served yet. */
function siteReady(domain: string): { status: string; reason: string } | undefined {
  return t.gw.controller.statuses().loops.nginx?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
}

/** One raw HTTP/1.1 exchange on a fresh connection: the whole answer as text. */
function raw(text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ port: t.httpPort, host: '127.0.0.1' }, () => s.write(text));
    const parts: Buffer[] = [];
    s.on('data', (c: Buffer) => parts.push(c));
    s.on('end', () => resolve(Buffer.concat(parts).toString('latin1')));
    s.on('error', reject);
  });
}

describe('a service without a site of its own yet', () => {
  it('is served through the default server while its reload waits, one with auth too; one with limits is not', async () => {
    const open: SvcInput = { run: 'open', ports: [echoPort] };
    const guarded: SvcInput = { run: 'guarded', ports: [echoPort], auth: true };
    const limited: SvcInput = { run: 'limited', ports: [echoPort], rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 100 }] };
    // The gateway reloaded Nginx as it started: this change waits out the interval.
    const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc([open, guarded, limited]) });
    expect(r.status).toBe(200);

    const answered = await eventually(async () => {
      const x = await get('open.gw.test', '/v1/x?q=1');
      return x.status === 200 ? x : undefined;
    }, 20_000);
    // The reload is held back: this came through the default server.
    expect(siteReady('open.gw.test')?.reason).not.toBe('Applied');
    const body = JSON.parse(answered.body) as { name: string; url: string; headers: Record<string, string> };
    expect(body).toMatchObject({ name: 'echo', url: '/v1/x?q=1' });
    // What its own site would pass on, and nothing of ours.
    expect(body.headers).toMatchObject({ host: 'open.gw.test', 'x-real-ip': '127.0.0.2', 'x-forwarded-proto': 'http' });
    expect(Object.keys(body.headers).filter((h) => h.startsWith('x-dstack'))).toEqual([]);

    // One with auth is served the same way, its token checked as its site would check it (no
    // control server here: no token is 401); gateway-by-host-auth.test.ts checks real tokens.
    const g = await get('guarded.gw.test');
    expect(g.status).toBe(401);
    expect(siteReady('guarded.gw.test')?.reason).not.toBe('Applied');
    // One with a rate limit needs its site's limit_req: until that is served, its host is unknown to Nginx.
    expect((await get('limited.gw.test')).status).toBe(404);
  });

  it('an unknown host gets the default 404, on every method, and the connection stays usable', async () => {
    const x = await get('nobody.gw.test');
    expect(x.status).toBe(404);
    expect(x.body).toMatch(NGINX_404);
    // A body to an unknown host: answered, not read.
    const post = await raw('POST /upload HTTP/1.1\r\nHost: nobody.gw.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello');
    expect(post).toMatch(/^HTTP\/1\.1 404 Not Found\r\n/);
    expect(post).toMatch(NGINX_404);
    // Two on one connection: both answered in order.
    const two = await raw(
      'GET /a HTTP/1.1\r\nHost: nobody.gw.test\r\n\r\nGET /b HTTP/1.1\r\nHost: open.gw.test\r\nConnection: close\r\n\r\n',
    );
    const statuses = [...two.matchAll(/^HTTP\/1\.1 (\d{3})/gm)].map((m) => m[1]);
    expect(statuses).toEqual(['404', '200']);
    expect(two).toContain('"url":"/b"');
  });

  it('its requests are in the access log under its host; unknown hosts are not logged', async () => {
    await get('open.gw.test', '/logged');
    await get('nobody.gw.test', '/not-logged');
    const log = join(t.stateDir, 'logs', 'access.log');
    const lines = await eventually(() => {
      const l = readFileSync(log, 'utf8').split('\n');
      return l.some((x) => x.includes(' open.gw.test 200 ')) ? l : undefined;
    });
    expect(lines.filter((x) => x.includes(' open.gw.test 200 ')).every((x) => x.endsWith(' 1'))).toBe(true);
    expect(lines.some((x) => x.includes('nobody.gw.test'))).toBe(false);
  });

  it('leaves with its service: a removed service is an unknown host at once', async () => {
    const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc([]) });
    expect(r.status).toBe(200);
    const x = await eventually(async () => {
      const y = await get('open.gw.test');
      return y.status === 404 ? y : undefined;
    }, 20_000);
    expect(x.body).toMatch(NGINX_404);
  });
});
