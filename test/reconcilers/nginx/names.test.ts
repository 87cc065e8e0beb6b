import { describe, expect, it } from 'vitest';
import {
  fileNameFor,
  limitKeyVariable,
  listenAddress,
  quote,
  rateFor,
  serverAddress,
  upstreamName,
  zoneName,
} from '../../../src/reconcilers/nginx/names.js';

describe('upstreamName', () => {
  it.each([
    ['main/llama-8b', 'ufc32f1ad.main.llama-8b'],
    ['my_proj/run_1', 'u7ad8eac3.my_proj.run_1'],
    ['a/b.c', 'uc0620514.a.b_c'],
  ])('%s → %s', (key, want) => expect(upstreamName(key)).toBe(want));

  it('differs in the first characters between runs that share a prefix', () => {
    const names = Array.from({ length: 1000 }, (_, i) => upstreamName(`project-1/run-${i}`));
    expect(new Set(names.map((n) => n.slice(0, 5))).size).toBeGreaterThan(900);
  });

  it('keeps keys apart that read the same once sanitized or truncated', () => {
    expect(upstreamName('a/b.c')).not.toBe(upstreamName('a/b_c'));
    const long = 'x'.repeat(100);
    expect(upstreamName(`p/${long}1`)).not.toBe(upstreamName(`p/${long}2`));
    expect(upstreamName(`p/${long}1`).length).toBeLessThanOrEqual(1 + 8 + 1 + 64);
  });

  it('is a valid Nginx upstream name', () => {
    for (const key of ['main/llama-8b', 'a/b.c', `p/${'é'.repeat(80)}`])
      expect(upstreamName(key)).toMatch(/^u[0-9a-f]{8}\.[A-Za-z0-9_.-]+$/);
  });
});

describe('zoneName', () => {
  it.each([
    ['main/llama-8b', 0, '$binary_remote_addr', 'ufc32f1ad.main.llama-8b.0.binary_remote_addr'],
    ['main/llama-8b', 2, '$http_x_api_key', 'ufc32f1ad.main.llama-8b.2.http_x_api_key'],
  ])('%s #%i keyed by %s → %s', (key, i, v, want) => expect(zoneName(key, i, v)).toBe(want));
});

describe('limitKeyVariable', () => {
  it.each([
    [{ type: 'ipAddress' as const }, '$binary_remote_addr'],
    [{ type: 'header' as const, header: 'X-Api-Key' }, '$http_x_api_key'],
    [{ type: 'header' as const, header: 'authorization' }, '$http_authorization'],
  ])('%j → %s', (key, want) => expect(limitKeyVariable(key)).toBe(want));
  it('refuses a header name that is not a variable name', () => {
    expect(() => limitKeyVariable({ type: 'header', header: 'x;y' })).toThrow(/invalid header/);
  });
});

describe('rateFor', () => {
  it.each([
    [1, '1r/s'],
    [10, '10r/s'],
    [2.5, '150r/m'],
    [0.5, '30r/m'],
    [0.001, '1r/m'],
  ])('%f rps → %s', (rps, want) => expect(rateFor(rps)).toBe(want));
  it.each([0, -1, Number.NaN, Number.POSITIVE_INFINITY])('refuses %f', (rps) => expect(() => rateFor(rps)).toThrow());
});

describe('listenAddress / serverAddress', () => {
  it.each([
    ['127.0.0.1', 80, '127.0.0.1:80'],
    ['', 443, '443'],
    ['::1', 8080, '[::1]:8080'],
    ['[::1]', 8080, '[::1]:8080'],
  ])('listen %s %i → %s', (h, p, want) => expect(listenAddress(h, p)).toBe(want));
  it.each([
    ['10.0.0.5', 8000, '10.0.0.5:8000'],
    ['replica.internal', 8000, 'replica.internal:8000'],
    ['fd00::5', 8000, '[fd00::5]:8000'],
  ])('server %s %i → %s', (h, p, want) => expect(serverAddress(h, p)).toBe(want));
  it('refuses hosts that could inject syntax', () => expect(() => serverAddress('a;b', 1)).toThrow());
});

describe('quote', () => {
  it.each([
    ['/var/log/a.log', '/var/log/a.log'],
    ['/path with space/x', "'/path with space/x'"],
    ['{"detail":"x"}', `'{"detail":"x"}'`],
    ["it's", `"it's"`],
    ['a\\b c', "'a\\\\b c'"],
    ['', "''"],
  ])('%s → %s', (s, want) => expect(quote(s)).toBe(want));
  it.each(['$host', 'a\nb', 'x\x00'])('refuses %j', (s) => expect(() => quote(s)).toThrow());
});

describe('fileNameFor', () => {
  it.each([
    [{ kind: 'global' as const }, '00-dstack-proxy-global.conf'],
    [{ kind: 'site' as const, domain: 'a.gw.test' }, 'sites/a.gw.test.conf'],
  ])('%j → %s', (v, want) => expect(fileNameFor(v)).toBe(want));
});
