// The pure rules of the server proxy: paths, headers, rate limits, stats windows.

import { describe, expect, it } from 'vitest';
import { downstreamRawHeaders, downstreamResponseHeaders, upstreamRequestHeaders } from '../../src/server-proxy/headers.js';
import { parseProxyTarget, upstreamTarget } from '../../src/server-proxy/paths.js';
import { longestPrefix, RateLimiter } from '../../src/server-proxy/rate-limit.js';
import { createInProcessStats } from '../../src/server-proxy/stats.js';
import { emptyState, type RateLimit } from '../../src/spec/types.js';

describe('parseProxyTarget / upstreamTarget', () => {
  it.each([
    ['/proxy/services/p/r', { project: 'p', run: 'r', rest: '', query: '' }, true, '/'],
    ['/proxy/services/p/r/?a=b&c=', { rest: '/', query: '?a=b&c=' }, true, '/?a=b&c='],
    ['/proxy/services/p/r//x/../y%2F', { rest: '//x/../y%2F' }, true, '//x/../y%2F'],
    ['/proxy/services/p/r/a/b?q', { rest: '/a/b' }, false, '/proxy/services/p/r/a/b?q'],
  ])('%s', (url, expected, strip, upstream) => {
    const t = parseProxyTarget(url);
    expect(t).toMatchObject(expected);
    expect(upstreamTarget(t!, strip)).toBe(upstream);
  });
  it.each([
    // [url, project/run, match (rate-limit path), forwarded with stripPrefix]
    ['/proxy/services/p/r/%761/chat', 'p/r', '/v1/chat', '/%761/chat'],
    ['/proxy/services/p/r//v1//chat', 'p/r', '/v1/chat', '//v1//chat'],
    ['/proxy/services/p/r/./v1/./chat', 'p/r', '/v1/chat', '/./v1/./chat'],
    ['/proxy/services/p/r/x/../v1', 'p/r', '/v1', '/x/../v1'],
    ['/proxy/services/p/r/x/%2E%2E/%2e/v1', 'p/r', '/v1', '/x/%2E%2E/%2e/v1'],
    ['/proxy/services/p/r/a%2Fb', 'p/r', '/a/b', '/a%2Fb'],
    ['/proxy/services/p/r/a%252Fb', 'p/r', '/a%2Fb', '/a%252Fb'],
    ['/proxy/services/p/r/x/..', 'p/r', '/', '/x/..'],
    ['/proxy/services//p//r/v1', 'p/r', '/v1', '/v1'],
    ['/proxy/services/%70/r/v1', 'p/r', '/v1', '/v1'],
    // Climbing out of the service: routed (and forwarded) where the normalised path leads.
    ['/proxy/services/p/pub/../priv/v1', 'p/priv', '/v1', '/v1'],
    // Back into the same service through its prefix: sent normalised, so the replica sees what was matched.
    ['/proxy/services/p/r/../r/v1', 'p/r', '/v1', '/v1'],
  ])('%s is routed and limited on the normalised path', (url, key, match, forwarded) => {
    const t = parseProxyTarget(url)!;
    expect(`${t.project}/${t.run}`).toBe(key);
    expect(t.match).toBe(match);
    expect(upstreamTarget(t, true)).toBe(forwarded);
    expect(upstreamTarget(t, false)).toBe(url);
  });

  it.each([
    '/proxy/services/p',
    '/proxy/services/p/r/..',
    '/proxy/services//r/',
    '/proxy/servicesx/p/r/',
    '/other',
    '/proxy/services/%zz/r/',
  ])('%s is not a service path', (url) => {
    expect(parseProxyTarget(url)).toBeNull();
  });
});

describe('headers', () => {
  const ctx = { clientIp: '10.1.1.1', proto: 'https', dropAuthorization: true };
  it('strips hop-by-hop and Connection-listed headers, sets X-Forwarded-*, drops Authorization for proxy auth', () => {
    const raw = [
      'Host',
      'a.example',
      'Connection',
      'keep-alive, X-Drop',
      'X-Drop',
      '1',
      'Keep-Alive',
      'timeout=5',
      'Authorization',
      'Bearer t',
      'X-Forwarded-For',
      '1.2.3.4',
      'X-Real-IP',
      'spoof',
      'Cookie',
      'c=1',
      'Transfer-Encoding',
      'chunked',
      'Expect',
      '100-continue',
    ];
    expect(upstreamRequestHeaders(raw, ctx)).toEqual([
      'Host',
      'a.example',
      'Cookie',
      'c=1',
      'X-Forwarded-For',
      '1.2.3.4, 10.1.1.1',
      'X-Forwarded-Proto',
      'https',
      'X-Real-IP',
      '10.1.1.1',
      'X-Forwarded-Host',
      'a.example',
    ]);
  });
  it('keeps Upgrade for a WebSocket handshake and Authorization for a public service', () => {
    const out = upstreamRequestHeaders(['Upgrade', 'websocket', 'Connection', 'Upgrade', 'Authorization', 'x'], {
      ...ctx,
      dropAuthorization: false,
      upgrade: true,
    });
    expect(out.slice(0, 6)).toEqual(['Upgrade', 'websocket', 'Authorization', 'x', 'Connection', 'Upgrade']);
  });
  it("drops the replica's hop-by-hop headers, Server and Date; keeps every Set-Cookie", () => {
    expect(
      downstreamResponseHeaders({
        server: 'x',
        date: 'y',
        connection: 'close, x-conn',
        'x-conn': '1',
        'keep-alive': 'timeout=5',
        'transfer-encoding': 'chunked',
        'set-cookie': ['a=1', 'b=2'],
        'content-type': 'text/plain',
      }),
    ).toEqual(['set-cookie', 'a=1', 'set-cookie', 'b=2', 'content-type', 'text/plain']);
  });
  it('the same rules over the raw list, names kept as the replica sent them', () => {
    const raw = [
      'Server',
      'x',
      'Date',
      'y',
      'Connection',
      'close, X-Conn',
      'X-Conn',
      '1',
      'Keep-Alive',
      'timeout=5',
      'Transfer-Encoding',
      'chunked',
      'Set-Cookie',
      'a=1',
      'Set-Cookie',
      'b=2',
      'Content-Type',
      'text/plain',
    ];
    expect(downstreamRawHeaders(raw)).toEqual(['Set-Cookie', 'a=1', 'Set-Cookie', 'b=2', 'Content-Type', 'text/plain']);
    // The length is the relay's to set from what it checked, never the replica's copy.
    expect(downstreamRawHeaders(['Connection', 'keep-alive', 'Content-Length', '0', 'X-A', '1'])).toEqual(['X-A', '1']);
  });
});

describe('rate limits', () => {
  const ip = (prefix: string, rps: number, burst: number): RateLimit => ({ prefix, key: { type: 'ipAddress' }, rps, burst });
  it('longest prefix wins; equal prefixes apply together', () => {
    const ls = [
      ip('/', 1, 0),
      ip('/api', 2, 0),
      { prefix: '/api', key: { type: 'header', header: 'x-key' }, rps: 3, burst: 0 } as RateLimit,
    ];
    expect(longestPrefix(ls, '/api/x').map((l) => l.rps)).toEqual([2, 3]);
    expect(longestPrefix(ls, '/other').map((l) => l.rps)).toEqual([1]);
  });
  it('burst + 1 requests pass at once, then one per 1/rps; keys are separate; an empty key is not limited', () => {
    let now = 1_000_000;
    const rl = new RateLimiter({ clock: { now: () => now } });
    const l = [ip('/', 2, 1)];
    const req = (clientIp: string) => ({ path: '/x', clientIp, header: () => undefined });
    expect([rl.allow('p/r', l, req('a')), rl.allow('p/r', l, req('a')), rl.allow('p/r', l, req('a'))]).toEqual([true, true, false]);
    expect(rl.allow('p/r', l, req('b'))).toBe(true);
    now += 500; // 2 rps: one token back
    expect([rl.allow('p/r', l, req('a')), rl.allow('p/r', l, req('a'))]).toEqual([true, false]);
    const byHeader: RateLimit[] = [{ prefix: '/', key: { type: 'header', header: 'X-Key' }, rps: 1, burst: 0 }];
    for (let i = 0; i < 5; i++) expect(rl.allow('p/r', byHeader, req('c'))).toBe(true);
  });
});

describe('in-process stats', () => {
  it('counts per service in the 30/60/300 s windows, zeros for idle services', async () => {
    let now = Date.UTC(2024, 11, 6, 12, 10, 0);
    const stats = createInProcessStats({ clock: { now: () => now } });
    const state = emptyState();
    const svc = (run: string) => ({
      project: 'p',
      run,
      https: false,
      auth: false,
      clientMaxBodySize: 0,
      stripPrefix: true,
      rateLimits: [],
      replicas: [],
    });
    state.spec.services = [svc('a'), svc('b')];
    stats.record('p/a', 100);
    now += 40_000;
    stats.record('p/a', 300);
    expect(await stats.collect(state)).toEqual([
      {
        project_name: 'p',
        run_name: 'a',
        stats: {
          '30': { requests: 1, request_time: 0.3 },
          '60': { requests: 2, request_time: 0.2 },
          '300': { requests: 2, request_time: 0.2 },
        },
      },
      {
        project_name: 'p',
        run_name: 'b',
        stats: { '30': { requests: 0, request_time: 0 }, '60': { requests: 0, request_time: 0 }, '300': { requests: 0, request_time: 0 } },
      },
    ]);
  });
});
