// What counts as loopback for the start-up check, and the auth_request target answering this
// host only. Peers on other hosts cannot be made on 127.0.0.0/8 (all of it is loopback), so the
// real gateway's app is asked through inject() with another client address.

import type { FastifyRequest } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isLoopbackAddress, listensOnLoopbackOnly, thisHostOnly } from '../../src/api/api-token.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';

describe('loopback addresses', () => {
  it.each([
    ['127.0.0.1', true],
    ['127.200.3.4', true],
    ['::1', true],
    ['0:0:0:0:0:0:0:1', true],
    ['::ffff:127.0.0.1', true],
    ['0.0.0.0', false],
    ['::', false],
    ['10.0.0.5', false],
    ['::ffff:10.0.0.5', false],
    ['128.0.0.1', false],
    ['localhost', false],
    [undefined, false],
  ])('%s → %s', (address, loopback) => {
    expect(isLoopbackAddress(address)).toBe(loopback);
  });

  it.each([
    ['127.0.0.1', true],
    ['127.0.0.2', true],
    ['[::1]', true],
    ['localhost', true],
    ['0.0.0.0', false],
    ['::', false],
    ['192.0.2.1', false],
    ['no-such-host.invalid', false],
  ])('listening on %s is loopback only: %s', async (host, loopback) => {
    expect(await listensOnLoopbackOnly(host)).toBe(loopback);
  });
});

describe('thisHostOnly', () => {
  const request = (
    remoteAddress: string | undefined,
    localAddress: string | undefined,
    listening: string | null = '0.0.0.0',
  ): FastifyRequest =>
    ({
      raw: { socket: { remoteAddress, localAddress } },
      server: { server: { address: () => (listening?.startsWith('/') ? listening : { address: listening, port: 8000 }) } },
    }) as unknown as FastifyRequest;

  it('lets loopback peers, peers on one of the host’s own addresses and Unix-socket peers through, refuses others', async () => {
    await expect(thisHostOnly(request('127.0.0.1', '127.0.0.1'))).resolves.toBeUndefined();
    await expect(thisHostOnly(request('::ffff:127.0.0.1', '::ffff:127.0.0.1'))).resolves.toBeUndefined();
    // Nginx calling an API bound to 10.0.0.5 connects from 10.0.0.5.
    await expect(thisHostOnly(request('10.0.0.5', '10.0.0.5'))).resolves.toBeUndefined();
    await expect(thisHostOnly(request('10.0.0.9', '10.0.0.5'))).rejects.toMatchObject({ code: 'DP_ERR_FORBIDDEN', status: 403 });
    await expect(thisHostOnly(request(undefined, undefined))).rejects.toMatchObject({ code: 'DP_ERR_FORBIDDEN' });
    // A Unix socket's peers have no address; only processes of this host can connect to it.
    await expect(thisHostOnly(request(undefined, undefined, '/run/dstack-proxy/api.sock'))).resolves.toBeUndefined();
  });
});

describe('the gateway app', () => {
  let t: TestGateway;
  beforeAll(async () => {
    t = await startTestGateway();
  });
  afterAll(async () => {
    await t?.cleanup();
  });

  it('answers /api/auth/:project to this host only; the model API and probes stay reachable', async () => {
    const local = await t.gw.app.inject({ url: '/api/auth/main' });
    expect(local.statusCode).toBe(401); // this host, no token: the check itself answers
    const remote = await t.gw.app.inject({
      url: '/api/auth/main',
      remoteAddress: '203.0.113.7',
      headers: { authorization: 'Bearer some-token-0123456789' },
    });
    expect(remote.statusCode).toBe(403);
    expect(remote.json()).toMatchObject({ code: 'DP_ERR_FORBIDDEN' });
    expect((await t.gw.app.inject({ url: '/healthz', remoteAddress: '203.0.113.7' })).statusCode).toBe(200);
    const models = await t.gw.app.inject({ url: '/api/models/main/models', remoteAddress: '203.0.113.7' });
    // The model API's own answer (a member token is required, in OpenAI's error shape), not the refusal above.
    expect(models.json()).not.toHaveProperty('code', 'DP_ERR_FORBIDDEN');
    expect(models.json()).toHaveProperty('error');
  });
});
