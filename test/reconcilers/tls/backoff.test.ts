import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  BackoffStore,
  DEFAULT_LIMITS,
  attemptsInNextHour,
  delayAfter,
  nextAllowed,
  recordDnsNotReady,
  recordFailure,
  type DomainBackoff,
} from '../../../src/reconcilers/tls/backoff.js';

const MIN = 60_000;
const HOUR = 60 * MIN;
const T0 = Date.UTC(2025, 0, 1);

/** Attempts a domain makes when every attempt fails, polling every minute for `span`. */
function simulate(span: number, acmeKey = 'k'): number[] {
  let e: DomainBackoff | undefined;
  let orders: number[] = [];
  const times: number[] = [];
  for (let t = T0; t < T0 + span; t += MIN) {
    if (nextAllowed(e, orders, acmeKey, t).at > t) continue;
    times.push(t);
    orders = [...orders, t];
    e = recordFailure(e, { at: t, error: 'x', acmeKey });
  }
  return times;
}

describe('the TLS backoff schedule', () => {
  it('starts short and grows to a 24 h cap', () => {
    expect([1, 2, 3, 4, 5, 6, 10, 11, 50].map((n) => delayAfter(n) / MIN)).toEqual([1, 5, 15, 30, 60, 120, 1440, 1440, 1440]);
  });

  it('attempts start at 0, 1, 6, 21, 51, 111 min when everything fails', () => {
    expect(simulate(2 * HOUR).map((t) => (t - T0) / MIN)).toEqual([0, 1, 6, 21, 51, 111]);
  });

  it('never makes more than 5 attempts for a domain in any hour, over two days', () => {
    const times = simulate(48 * HOUR);
    for (const t of times) expect(times.filter((u) => u >= t && u < t + HOUR).length).toBeLessThanOrEqual(5);
  });

  it('a changed ACME server may retry at once, but the hourly limit still holds', () => {
    let e: DomainBackoff | undefined;
    for (let i = 0; i < 5; i++) e = recordFailure(e, { at: T0 + i * 1000, error: 'x', acmeKey: `k${i}` });
    expect(e!.failedAttempts).toBe(1); // each key starts over
    const next = nextAllowed(e, [], 'k-new', T0 + 5000);
    expect(next.why).toBe('hourly');
    expect(next.at).toBe(T0 + HOUR);
    const one = recordFailure(undefined, { at: T0, error: 'x', acmeKey: 'a' });
    expect(nextAllowed(one, [], 'b', T0 + 1000).at).toBe(T0 + 1000);
    expect(nextAllowed(one, [], 'a', T0 + 1000).at).toBe(T0 + MIN);
  });

  it('stays within 300 orders per 3 h across domains', () => {
    const orders = Array.from({ length: 300 }, (_, i) => T0 + i * 1000);
    const next = nextAllowed(undefined, orders, 'k', T0 + HOUR);
    expect(next).toEqual({ at: T0 + 3 * HOUR, why: 'orders' }); // the oldest leaves the window
    expect(nextAllowed(undefined, orders.slice(1), 'k', T0 + HOUR).at).toBe(T0 + HOUR);
  });

  it('DNS not ready spends no attempt and checks again in 30 s', () => {
    const e = recordDnsNotReady(undefined, { at: T0, error: 'nx', acmeKey: 'k' });
    expect(e.failedAttempts).toBe(0);
    expect(e.attempts).toEqual([]);
    expect(nextAllowed(e, [], 'k', T0).at).toBe(T0 + 30_000);
  });

  it('dry-run figure: attempts the backoff allows in the next hour', () => {
    expect(attemptsInNextHour(undefined, 'k', T0)).toBe(5); // 0, 1, 6, 21, 51 min
    const e = recordFailure(recordFailure(undefined, { at: T0, error: 'x', acmeKey: 'k' }), { at: T0 + MIN, error: 'x', acmeKey: 'k' });
    expect(attemptsInNextHour(e, 'k', T0 + MIN)).toBe(3); // 6, 21, 51 min
    expect(attemptsInNextHour(e, 'k', T0 + 2 * HOUR, DEFAULT_LIMITS)).toBe(3); // now, +15 min, +45 min
  });
});

describe('BackoffStore', () => {
  it('persists atomically with mode 0600 and reloads', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-tls-backoff-'));
    try {
      const path = join(dir, 'tls-backoff.json');
      const a = new BackoffStore(path);
      await a.update((d) => {
        d.domains['a.test'] = recordFailure(undefined, { at: T0, error: 'boom', acmeKey: 'k' });
        d.orders.push(T0);
      }, T0);
      expect(statSync(path).mode & 0o777).toBe(0o600);
      const b = new BackoffStore(path);
      expect((await b.get('a.test'))?.failedAttempts).toBe(1);
      expect(JSON.parse(readFileSync(path, 'utf8')).orders).toEqual([T0]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
