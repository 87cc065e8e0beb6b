// registerServerProxy on a bare fastify app: the fast path (default: the raw path and Node's
// 'request' event) and the fastify routes (fastPath: false) proxy alike, other routes still reach fastify, and upstream
// connections are kept alive and reused (one connect for sequential requests).

import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, request, startEcho } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';
import { startPluginApp, type PluginApp } from './harness.js';

let echo: Server;
let echoPort: number;

beforeAll(async () => {
  echoPort = await freePort();
  echo = await startEcho('replica', { port: echoPort });
});
afterAll(() => close(echo));

describe.each([true, false])('fastPath: %s', (fastPath) => {
  let proxy: PluginApp;
  let port: number;
  beforeAll(async () => {
    proxy = await startPluginApp(echoPort, { clientMaxBodySize: 1024, fastPath });
    port = proxy.port;
  });
  afterAll(() => proxy.app.close());

  it('proxies with X-Forwarded-*, reuses one upstream connection, leaves other routes to fastify', async () => {
    for (let i = 0; i < 3; i++) {
      const r = await request({ port, host: 'h.example', path: `/proxy/services/p/r/a/${i}?q=1` });
      expect(r.status).toBe(200);
      const body = JSON.parse(r.body) as { url: string; headers: Record<string, string> };
      expect(body.url).toBe(`/a/${i}?q=1`);
      expect(body.headers['x-forwarded-host']).toBe('h.example');
      expect(body.headers['x-real-ip']).toBe('127.0.0.1');
      expect(r.headers.server).toBeUndefined();
    }
    expect(proxy.connects()).toBe(1);
    expect(JSON.parse((await request({ port, host: 'h', path: '/other' })).body)).toEqual({ fastify: true });
    expect((await request({ port, host: 'h', path: '/proxy/services/p/none/' })).status).toBe(404);
    expect(
      (await request({ port, host: 'h', path: '/proxy/services/p/r', method: 'POST', headers: { 'content-length': '2000' } })).status,
    ).toBe(308);
  });
});
