// The by-host auth check our default server asks before it relays a host without a site: what
// the host's service would have its site do, from the current document.

import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import type { AuthProvider } from '../../src/auth/control-server.js';
import { HOST_AUTH_PATH } from '../../src/dataplane/service-header.js';
import { hostAuthRoutes } from '../../src/gateway/host-auth.js';
import { emptyState, type ProxyState, type Service } from '../../src/spec/types.js';

function service(run: string, extra: Partial<Service> = {}): Service {
  return {
    project: 'main',
    run,
    domain: `${run}.gw.test`,
    https: false,
    auth: false,
    stripPrefix: true,
    clientMaxBodySize: 64 * 1024 * 1024,
    rateLimits: [],
    replicas: [],
    ...extra,
  } as Service;
}

async function app(services: Service[]) {
  const state: ProxyState = emptyState();
  state.spec.services.push(...services);
  const asked: string[] = [];
  const auth: AuthProvider = {
    check: async (project, token) => (asked.push(`${project}:${token}`), token === 'good' ? 'allow' : 'deny'),
    close: async () => undefined,
  };
  const a = Fastify();
  await a.register(hostAuthRoutes, { auth, getState: () => state });
  const ask = (host: string, o: { token?: string; method?: string } = {}) =>
    a.inject({
      method: 'GET',
      url: HOST_AUTH_PATH,
      headers: {
        'x-dstack-proxy-host': host,
        'x-dstack-proxy-method': o.method ?? 'GET',
        ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
      },
    });
  return { ask, asked };
}

describe('the by-host auth check', () => {
  it("answers as the host's service's site would, naming the service only when its token passed", async () => {
    const { ask, asked } = await app([
      service('open'),
      service('guarded', { auth: true }),
      service('chat', { auth: true, model: { name: 'm', format: 'openai', prefix: '/v1' } } as Partial<Service>),
      service('limited', { auth: true, rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 1, burst: 0 }] } as Partial<Service>),
    ]);
    const headersOf = (r: { headers: Record<string, unknown> }) =>
      Object.fromEntries(Object.entries(r.headers).filter(([k]) => k.startsWith('x-dstack')));

    for (const host of ['nobody.gw.test', 'open.gw.test', 'LIMITED.gw.test']) {
      const r = await ask(host, { token: 'good' });
      expect([r.statusCode, headersOf(r)]).toEqual([200, {}]); // nothing to check (limited: not relayed by Host)
    }
    expect((await ask('guarded.gw.test')).statusCode).toBe(401);
    expect((await ask('guarded.gw.test', { token: 'bad' })).statusCode).toBe(403);
    const ok = await ask('guarded.gw.test', { token: 'good' });
    expect([ok.statusCode, headersOf(ok)]).toEqual([200, { 'x-dstack-proxy-auth-service': 'main/guarded' }]);

    const preflight = await ask('chat.gw.test', { method: 'OPTIONS' });
    expect([preflight.statusCode, headersOf(preflight)]).toEqual([200, { 'x-dstack-proxy-cors': '*' }]);
    const refused = await ask('chat.gw.test');
    expect([refused.statusCode, headersOf(refused)]).toEqual([401, { 'x-dstack-proxy-cors': '*' }]);
    const chat = await ask('chat.gw.test', { token: 'good' });
    expect(headersOf(chat)).toEqual({ 'x-dstack-proxy-cors': '*', 'x-dstack-proxy-auth-service': 'main/chat' });
    expect(asked).toEqual(['main:bad', 'main:good', 'main:good']);
  });
});
