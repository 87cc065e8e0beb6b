// One path, one meaning: the in-server proxy matches rate-limit prefixes on the normalised path
// (as Nginx matches locations), so `%76`, `//`, `/./` and `x/..` spellings do not slip past a
// limit, while the replica still gets the target as sent. And two Host headers are a 400
// everywhere: the raw fast path, Node's handover path, WebSocket upgrades, the fastify API and
// model API of the server-proxy and of the gateway, and the gateway's Nginx.

import { connect as netConnect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gatewayDoc, putState, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { parseResponses } from './forged-replica.js';
import { startHarness, startPluginApp, type Harness, type PluginApp } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

/** One request on its own connection, read until the server closes it. */
function exchange(port: number, request: string): Promise<{ status: number; body: string; text: string }> {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    let text = '';
    s.on('data', (c: Buffer) => (text += c.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => {
      const r = parseResponses(text).responses[0];
      resolve({ status: r?.status ?? Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0), body: r?.body ?? '', text });
    });
    s.write(request);
  });
}

const HTTP11 = (target: string, extra = ''): string => `GET ${target} HTTP/1.1\r\nHost: h\r\n${extra}Connection: close\r\n\r\n`;
const HTTP10 = (target: string, extra = ''): string => `GET ${target} HTTP/1.0\r\nHost: h\r\n${extra}\r\n`;

let replica: TestReplica;
let app: PluginApp;

beforeAll(async () => {
  replica = await startReplica();
  app = await startPluginApp(replica.port, {
    clientMaxBodySize: 0,
    rateLimits: [{ prefix: '/v1', key: { type: 'ipAddress' }, rps: 0.001, burst: 0 }],
  });
});

afterAll(async () => {
  await app?.app.close();
  await replica?.close();
});

describe('rate limits match the normalised path', () => {
  it.each([
    ['the raw fast path', HTTP11],
    ["Node's handover path", HTTP10],
  ])('on %s: once /v1 is spent, no spelling of it passes', async (_name, request) => {
    // One bucket (one client address) for both paths: the first request may find it spent already.
    const first = await exchange(app.port, request('/proxy/services/p/r/v1/chat/completions'));
    expect([200, 429]).toContain(first.status);
    for (const spelling of [
      '/%761/chat/completions',
      '//v1/chat/completions',
      '/./v1/chat/completions',
      '/x/../v1/chat/completions',
      '/%2E/v1',
      '/v%31',
    ]) {
      const r = await exchange(app.port, request(`/proxy/services/p/r${spelling}`));
      expect(r.status, spelling).toBe(429);
    }
  });

  it('the replica gets the target as sent', async () => {
    const r = await exchange(app.port, HTTP11('/proxy/services/p/r/echo/%7Ex/./y//z?q=%76'));
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body)).toMatchObject({ url: '/echo/%7Ex/./y//z?q=%76' });
  });
});

describe('two Host headers are a 400', () => {
  const TWO = 'Host: other\r\n';

  it.each([
    ['the raw fast path (handed to Node)', HTTP11('/proxy/services/p/r/echo', TWO)],
    ["Node's handover path", HTTP10('/proxy/services/p/r/echo', TWO)],
    [
      'a WebSocket upgrade',
      HTTP11(
        '/proxy/services/p/r/ws',
        `${TWO}Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n`,
      ),
    ],
  ])('in-server proxy, %s; nothing reaches the replica', async (_name, request) => {
    const before = replica.seen.length;
    const r = await exchange(app.port, request);
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body)).toEqual({ detail: 'More than one Host header' });
    expect(replica.seen.length).toBe(before);
  });

  describe('on fastify routes of server-proxy', () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness();
    });
    afterAll(async () => {
      await h?.close();
    });
    it.each(['/api/v1/status', '/proxy/models/p/models', '/healthz'])('%s', async (path) => {
      const port = Number(new URL(h.url).port);
      const r = await exchange(port, HTTP11(path, TWO));
      expect(r.status).toBe(400);
      expect(JSON.parse(r.body)).toMatchObject({ code: 'DP_ERR_DUPLICATE_HOST' });
      expect((await exchange(port, HTTP11('/healthz'))).status).toBe(200);
    });
  });

  describe('on the gateway', () => {
    let t: TestGateway;
    beforeAll(async () => {
      t = await startTestGateway();
      const put = await putState(t, gatewayDoc([{ run: 'web', ports: [replica.port] }]));
      expect(put.status, put.body).toBe(200);
      await eventually(
        async () =>
          (await exchange(t.httpPort, `GET /echo HTTP/1.1\r\nHost: web.gw.test\r\nConnection: close\r\n\r\n`)).status === 200
            ? true
            : undefined,
        15_000,
      );
    }, 60_000);
    afterAll(async () => {
      await t?.cleanup();
    }, 120_000);

    it.each(['/api/v1/state', '/api/models/main/models', '/healthz'])('API %s', async (path) => {
      const r = await exchange(t.apiPort, HTTP11(path, TWO));
      expect(r.status).toBe(400);
      expect(JSON.parse(r.body)).toMatchObject({ code: 'DP_ERR_DUPLICATE_HOST' });
    });

    it('Nginx refuses it too', async () => {
      const before = replica.seen.length;
      const r = await exchange(t.httpPort, `GET /echo HTTP/1.1\r\nHost: web.gw.test\r\nHost: other.gw.test\r\nConnection: close\r\n\r\n`);
      expect(r.status).toBe(400);
      expect(replica.seen.length).toBe(before);
    });
  });
});
