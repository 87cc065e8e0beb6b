// registerServerProxy on a bare fastify app: the raw 'request' fast path (default) and the
// fastify routes (fastPath: false) proxy alike, other routes still reach fastify, and upstream
// connections are kept alive and reused (one connect for sequential requests).

import { connect as netConnect, type Socket } from 'node:net';
import type { Server } from 'node:http';
import { fastify } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerServerProxy } from '../../src/server-proxy/plugin.js';
import { emptyState, type ProxyState } from '../../src/spec/types.js';
import { close, request, startEcho } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';

let echo: Server;
let echoPort: number;
const state: ProxyState = emptyState();

beforeAll(async () => {
  echoPort = await freePort();
  echo = await startEcho('replica', { port: echoPort });
  state.spec.services.push({
    project: 'p', run: 'r', id: 'x', https: false, auth: false, stripPrefix: true, clientMaxBodySize: 1024, rateLimits: [],
    replicas: [{ id: 'a', appPort: echoPort, direct: { host: '127.0.0.1', port: echoPort } }],
  } as ProxyState['spec']['services'][number]);
});
afterAll(() => close(echo));

describe.each([true, false])('fastPath: %s', (fastPath) => {
  let app: ReturnType<typeof fastify>;
  let port: number;
  let connects = 0;
  beforeAll(async () => {
    app = fastify();
    app.get('/other', async () => ({ fastify: true }));
    await registerServerProxy(app, {
      getState: () => state,
      connect: async () => {
        connects++;
        const s: Socket = netConnect(echoPort, '127.0.0.1');
        await new Promise((resolve, reject) => s.once('connect', resolve).once('error', reject));
        return s;
      },
      authorize: async () => 'allow',
      fastPath,
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    port = (app.server.address() as { port: number }).port;
  });
  afterAll(() => app.close());

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
    expect(connects).toBe(1);
    expect(JSON.parse((await request({ port, host: 'h', path: '/other' })).body)).toEqual({ fastify: true });
    expect((await request({ port, host: 'h', path: '/proxy/services/p/none/' })).status).toBe(404);
    expect((await request({ port, host: 'h', path: '/proxy/services/p/r', method: 'POST', headers: { 'content-length': '2000' } })).status).toBe(308);
  });
});
