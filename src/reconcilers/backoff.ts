// Retry backoff for reconcile actions and passes.
//
// Defaults (DEFAULT_BACKOFF):
//   baseMs = 1_000          // 1 s: the delay after the first failure
//   factor = 2              // each further consecutive failure doubles the delay
//   maxMs  = 5 * 60_000     // 5 min: no delay is ever longer, jitter included
//   jitter = 0.2            // each delay is spread uniformly over ±20 % of its nominal value
//
// Nominal schedule by attempt (consecutive failures): 1 s, 2 s, 4 s, 8 s, 16 s, 32 s, 64 s,
// 128 s, 256 s, 300 s, 300 s, … A success resets the key to attempt 0. Jitter keeps many keys
// that failed together (one ACME outage, one unreachable host) from retrying in lockstep.

import { ProxyError } from '../errors.js';

export interface BackoffPolicy {
  /** Delay after the first failure, in ms. */
  baseMs: number;
  /** Multiplier per further consecutive failure (>= 1). */
  factor: number;
  /** Upper bound of any delay, in ms, jitter included. */
  maxMs: number;
  /** Fraction in [0, 1): the delay is drawn from nominal × [1 - jitter, 1 + jitter]. */
  jitter: number;
}

export const DEFAULT_BACKOFF: Readonly<BackoffPolicy> = Object.freeze({
  baseMs: 1_000, // 1 s
  factor: 2,
  maxMs: 5 * 60_000, // 5 min
  jitter: 0.2, // ±20 %
});

/** Fills defaults and throws DP_ERR_BAD_OPTION on a policy that makes no sense. */
export function backoffPolicy(partial: Partial<BackoffPolicy> = {}): BackoffPolicy {
  const p: BackoffPolicy = { ...DEFAULT_BACKOFF, ...partial };
  const bad = (field: string, why: string): never => {
    throw new ProxyError('DP_ERR_BAD_OPTION', `backoff.${field} ${why}`);
  };
  if (!Number.isFinite(p.baseMs) || p.baseMs < 0) bad('baseMs', 'must be a finite number >= 0');
  if (!Number.isFinite(p.factor) || p.factor < 1) bad('factor', 'must be a finite number >= 1');
  if (!Number.isFinite(p.maxMs) || p.maxMs < p.baseMs) bad('maxMs', 'must be a finite number >= baseMs');
  if (!Number.isFinite(p.jitter) || p.jitter < 0 || p.jitter >= 1) bad('jitter', 'must be in [0, 1)');
  return p;
}

/**
 * The delay before retry number `attempt` (1 = after the first failure), in whole ms:
 * min(maxMs, baseMs × factor^(attempt-1) × (1 + jitter × (2·random() - 1))).
 * `random` returns a number in [0, 1), as Math.random does.
 */
export function nextDelay(attempt: number, policy: Readonly<BackoffPolicy> = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  const n = Math.max(1, Math.floor(attempt));
  const nominal = Math.min(policy.maxMs, policy.baseMs * policy.factor ** (n - 1));
  const spread = 1 + policy.jitter * (2 * random() - 1);
  return Math.round(Math.min(policy.maxMs, Math.max(0, nominal * spread)));
}

/** Consecutive-failure counts per key, and the delay each next retry should wait. */
export class BackoffTracker {
  readonly #policy: Readonly<BackoffPolicy>;
  readonly #random: () => number;
  readonly #attempts = new Map<string, number>();

  constructor(policy: Readonly<BackoffPolicy> = DEFAULT_BACKOFF, random: () => number = Math.random) {
    this.#policy = policy;
    this.#random = random;
  }

  /** Records a failure of `key`; returns its consecutive-failure count and the delay to wait. */
  failure(key: string): { attempts: number; delayMs: number } {
    const attempts = (this.#attempts.get(key) ?? 0) + 1;
    this.#attempts.set(key, attempts);
    return { attempts, delayMs: nextDelay(attempts, this.#policy, this.#random) };
  }

  /** Forgets `key`: the next failure starts again at baseMs. */
  reset(key: string): void {
    this.#attempts.delete(key);
  }

  /** Consecutive failures of `key` so far (0 if none). */
  attempts(key: string): number {
    return this.#attempts.get(key) ?? 0;
  }

  keys(): string[] {
    return [...this.#attempts.keys()];
  }
}
