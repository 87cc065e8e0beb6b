import { describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/errors.js';
import { BackoffTracker, DEFAULT_BACKOFF, backoffPolicy, nextDelay } from '../../src/reconcilers/backoff.js';

const mid = () => 0.5; // no jitter: 1 + 0.2 × (2 × 0.5 - 1) = 1

describe('nextDelay', () => {
  it('follows base × factor^(attempt-1) and caps at maxMs (defaults)', () => {
    const schedule = Array.from({ length: 12 }, (_, i) => nextDelay(i + 1, DEFAULT_BACKOFF, mid));
    expect(schedule).toEqual([1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000, 300_000, 300_000]);
  });

  it('documents the defaults: 1 s, ×2, 5 min, ±20 %', () => {
    expect(DEFAULT_BACKOFF).toEqual({ baseMs: 1_000, factor: 2, maxMs: 300_000, jitter: 0.2 });
  });

  it('treats attempt < 1 as the first attempt', () => {
    expect(nextDelay(0, DEFAULT_BACKOFF, mid)).toBe(1_000);
  });

  it('stays finite and capped for huge attempt counts', () => {
    expect(nextDelay(10_000, DEFAULT_BACKOFF, mid)).toBe(300_000);
  });

  const policy = { baseMs: 1_000, factor: 2, maxMs: 60_000, jitter: 0.2 };
  const jitterCases: { name: string; attempt: number; random: number; want: number }[] = [
    { name: 'random 0 gives the lower bound (−20 %)', attempt: 3, random: 0, want: 3_200 },
    { name: 'random just under 1 approaches the upper bound (+20 %)', attempt: 3, random: 0.999_999, want: 4_800 },
    { name: 'the upper bound never passes maxMs', attempt: 10, random: 0.999_999, want: 60_000 },
    { name: 'the lower bound at the cap is 80 % of maxMs', attempt: 10, random: 0, want: 48_000 },
  ];
  for (const c of jitterCases) {
    it(c.name, () => expect(nextDelay(c.attempt, policy, () => c.random)).toBe(c.want));
  }

  it('keeps every jittered delay within ±jitter of nominal', () => {
    let seed = 7;
    const rnd = () => ((seed = (seed * 16_807) % 2_147_483_647) - 1) / 2_147_483_646;
    for (let attempt = 1; attempt <= 12; attempt++) {
      const nominal = Math.min(60_000, 1_000 * 2 ** (attempt - 1));
      for (let i = 0; i < 200; i++) {
        const d = nextDelay(attempt, policy, rnd);
        expect(d).toBeGreaterThanOrEqual(Math.floor(nominal * 0.8));
        expect(d).toBeLessThanOrEqual(Math.min(60_000, Math.ceil(nominal * 1.2)));
      }
    }
  });

  it('with jitter 0 is exact', () => {
    expect(nextDelay(4, { ...policy, jitter: 0 }, () => 0)).toBe(8_000);
  });
});

describe('backoffPolicy', () => {
  it('fills defaults', () => {
    expect(backoffPolicy({ baseMs: 10 })).toEqual({ ...DEFAULT_BACKOFF, baseMs: 10 });
  });

  const bad: [string, Record<string, number>][] = [
    ['negative base', { baseMs: -1 }],
    ['factor below 1', { factor: 0.5 }],
    ['cap below base', { baseMs: 10, maxMs: 5 }],
    ['jitter of 1', { jitter: 1 }],
    ['NaN', { baseMs: Number.NaN }],
  ];
  for (const [name, p] of bad) {
    it(`rejects ${name}`, () => {
      expect(() => backoffPolicy(p)).toThrow(ProxyError);
    });
  }
});

describe('BackoffTracker', () => {
  it('counts consecutive failures per key and resets on success', () => {
    const t = new BackoffTracker(DEFAULT_BACKOFF, mid);
    expect(t.failure('a')).toEqual({ attempts: 1, delayMs: 1_000 });
    expect(t.failure('a')).toEqual({ attempts: 2, delayMs: 2_000 });
    expect(t.failure('b')).toEqual({ attempts: 1, delayMs: 1_000 });
    expect(t.attempts('a')).toBe(2);
    t.reset('a');
    expect(t.attempts('a')).toBe(0);
    expect(t.failure('a')).toEqual({ attempts: 1, delayMs: 1_000 });
    expect(t.keys().sort()).toEqual(['a', 'b']);
  });
});
