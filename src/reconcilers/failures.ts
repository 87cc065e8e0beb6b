// Per-key failure bookkeeping of one loop: which keys are failing, how often, whether they may
// be retried yet, and the loop-level Ready/Degraded conditions that follow from that.

import { TerminalError } from '../errors.js';
import type { BackoffPolicy } from './backoff.js';
import { BackoffTracker } from './backoff.js';
import type { ConditionInput } from './conditions.js';
import type { FailureInfo } from './types.js';

export interface Failure {
  message: string;
  attempts: number;
  /** A TerminalError: parked until the generation changes. */
  terminal: boolean;
  /** The generation the failure happened in. */
  generation: number;
  /** Epoch ms before which the key is not retried; null when terminal. */
  retryAt: number | null;
}

export class FailureBook {
  readonly #backoff: BackoffTracker;
  readonly #failures = new Map<string, Failure>();

  constructor(policy: Readonly<BackoffPolicy>, random?: () => number) {
    this.#backoff = new BackoffTracker(policy, random);
  }

  /** Records a failure; returns it and, unless terminal, the delay before the retry. */
  fail(key: string, err: unknown, generation: number, now: number): Failure & { delayMs: number | null } {
    const terminal = err instanceof TerminalError;
    const { attempts, delayMs } = this.#backoff.failure(key);
    const f: Failure = { message: errorMessage(err), attempts, terminal, generation, retryAt: terminal ? null : now + delayMs };
    this.#failures.set(key, f);
    return { ...f, delayMs: terminal ? null : delayMs };
  }

  succeed(key: string): void {
    this.#failures.delete(key);
    this.#backoff.reset(key);
  }

  /**
   * True for a key that failed in this generation and is still waiting out its backoff, or is
   * terminal. A new generation releases every key at once (its attempt count is kept).
   */
  blocked(key: string, generation: number, now: number): boolean {
    const f = this.#failures.get(key);
    if (f === undefined || f.generation !== generation) return false;
    return f.terminal || (f.retryAt !== null && now < f.retryAt);
  }

  /** Forgets every key not in `keep` (converged or gone); returns the keys forgotten. */
  retain(keep: ReadonlySet<string>): string[] {
    const gone = [...this.#failures.keys()].filter((k) => !keep.has(k));
    for (const key of gone) this.succeed(key);
    return gone;
  }

  get size(): number {
    return this.#failures.size;
  }

  entries(): [string, Failure][] {
    return [...this.#failures.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }

  info(): Record<string, FailureInfo> {
    return Object.fromEntries(this.entries().map(([k, f]) => [k, failureInfo(f)]));
  }
}

export function failureInfo(f: Failure): FailureInfo {
  const info: FailureInfo = { message: f.message, attempts: f.attempts, terminal: f.terminal };
  if (f.retryAt !== null) info.retryAt = new Date(f.retryAt).toISOString();
  return info;
}

/**
 * The loop-level conditions after a pass (pure). Ready: everything planned is applied.
 * Degraded: the pass or at least one key is failing. Messages hold no counters or times, so
 * a steady failure does not rewrite status on every pass.
 */
export function loopConditions(passFailure: Failure | null, failing: [string, Failure][], generation: number): ConditionInput[] {
  const pair = (ready: boolean, reason: string, message: string): ConditionInput[] => [
    { type: 'Ready', status: ready ? 'True' : 'False', reason, message, observedGeneration: generation },
    { type: 'Degraded', status: ready ? 'False' : 'True', reason: ready ? 'AsExpected' : reason, message, observedGeneration: generation },
  ];
  if (passFailure !== null) return pair(false, 'PassFailed', `reconcile pass failed: ${passFailure.message}`);
  if (failing.length === 0) return pair(true, 'Converged', 'observed state matches desired state');
  const listed = failing.slice(0, 5).map(([k, f]) => `${k}: ${f.message}`);
  const more = failing.length > 5 ? `; and ${failing.length - 5} more` : '';
  const reason = failing.every(([, f]) => f.terminal) ? 'ActionsFailedTerminally' : 'ActionsFailing';
  return pair(false, reason, `${failing.length} failing: ${listed.join('; ')}${more}`);
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
