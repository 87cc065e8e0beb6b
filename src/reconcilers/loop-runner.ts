// One loop under the controller: its passes, its action queue, its failing keys and their
// timers, its status. A pass: the gate (dependencies settled) → desired (pure) → observe →
// plan (pure) → apply the eligible actions on the loop's own queue → report Ready/Degraded.
// Every outcome, of an action or of the pass itself, takes effect in one switch (#settleKey).

import PQueue from 'p-queue';
import type pino from 'pino';
import type { ProxyState } from '../spec/types.js';
import type { BackoffPolicy } from './backoff.js';
import { KeyTimers, type Clock } from '../clock.js';
import { FailureBook, loopConditions } from './failures.js';
import { assertUniqueKeys, badOption } from './loop-graph.js';
import { PassQueue } from './pass-queue.js';
import { Settling } from './settling.js';
import { StatusFeed } from './status.js';
import type { Action, AnyLoop, BatchOutcome, FailureInfo, LoopContext, LoopCounters, LoopStatus, StatusSnapshot } from './types.js';

export interface SpecSnapshot {
  state: ProxyState;
  generation: number;
}

/** The key under which a failing pass (desired/observe/plan threw) appears in LoopStatus.failures. */
export const PASS_KEY = '(pass)';
const SKIPPED = Symbol('skipped');

/** What a runner needs of the controller around it. */
export interface RunnerHost {
  getSpec(): SpecSnapshot;
  statuses(): StatusSnapshot;
  clock: Clock;
  logger: pino.Logger;
  stopped(): boolean;
  /** Resolves when a pass of `runner` may start: the loops it depends on have settled. */
  gate(runner: LoopRunner): Promise<void>;
  /** The status of `runner` changed: tell listeners and the loops it triggers. */
  publish(runner: LoopRunner): void;
}

export interface RunnerOptions {
  concurrency: number;
  backoff: BackoffPolicy;
  random: (() => number) | undefined;
}

export class LoopRunner {
  readonly loop: AnyLoop;
  /** Single flight plus one pending pass. */
  readonly passes: PassQueue;
  /** The loop's action queue (its concurrency). */
  readonly actions: PQueue;
  readonly status: StatusFeed;
  /** Failing keys: action keys, and PASS_KEY while the pass itself fails. */
  readonly #failures: FailureBook;
  /** One wake-up per key: its retry after a failure, or its requeue. */
  readonly timers: KeyTimers;
  readonly settling = new Settling();
  readonly counters: LoopCounters = { passes: 0, errors: 0, actionsApplied: 0, lastPassDurationMs: 0 };
  readonly #host: RunnerHost;

  constructor(loop: AnyLoop, host: RunnerHost, o: RunnerOptions) {
    const concurrency = loop.concurrency ?? o.concurrency;
    if (!Number.isInteger(concurrency) || concurrency < 1) badOption(`loop ${loop.name}: concurrency must be an integer >= 1`);
    this.loop = loop;
    this.#host = host;
    this.passes = new PassQueue(
      () => this.#pass().catch((err: unknown) => host.logger.error({ err, loop: loop.name }, 'reconcile pass crashed')),
      () => this.settling.wake(),
    );
    this.actions = new PQueue({ concurrency });
    this.status = new StatusFeed({
      now: () => host.clock.now(),
      generation: () => this.settling.generation,
      publish: () => host.publish(this),
    });
    this.#failures = new FailureBook(o.backoff, o.random);
    this.timers = new KeyTimers(host.clock);
  }

  /** The loop's status with its failing keys; a deep copy. */
  snapshot(): LoopStatus {
    return this.status.store.snapshot(this.#failureInfo());
  }

  context(): LoopContext {
    return {
      generation: this.settling.generation,
      status: this.status.store.writer(),
      clock: this.#host.clock,
      logger: this.#host.logger.child({ loop: this.loop.name }),
    };
  }

  async #pass(): Promise<void> {
    // 0. The gate: the loops this one depends on have settled a pass of the current
    //    generation (Nginx: the balancer sockets its sites point at exist). The pass reads
    //    everything after that, so it also covers any trigger that arrived meanwhile (the
    //    dependency's own status change, typically).
    await this.#host.gate(this);
    const covered = this.passes.claim();
    try {
      await this.#steps();
    } finally {
      covered?.resolve();
    }
  }

  async #steps(): Promise<void> {
    const { loop } = this;
    const failures = this.#failures;
    const clock = this.#host.clock;
    const t0 = clock.now();
    this.status.hold();
    this.settling.begin();
    this.counters.passes++;
    let generation = this.settling.generation;
    let failed = false;
    try {
      let actions: Action<unknown>[];
      const ctx = this.context();
      try {
        // 1. Desired: what the spec and the other loops' status ask for (pure).
        const spec = this.#host.getSpec();
        generation = this.settling.generation = ctx.generation = spec.generation;
        const desired = loop.desired(spec.state, this.#host.statuses());
        // 2. Observe: what the world looks like now.
        const observed = await loop.observe(ctx);
        // 3. Compare: the actions that close the gap (pure).
        actions = loop.plan(desired, observed);
        assertUniqueKeys(loop.name, actions);
        this.#settleKey(PASS_KEY, 'done', generation);
      } catch (error) {
        failed = true;
        this.#settleKey(PASS_KEY, { error }, generation);
        return;
      }
      // What a dependent of a loop that settles after planning reads is there now; results
      // of the actions below reach it as status changes (each triggers it again).
      if (loop.settlesAfter === 'plan') this.#settled(generation, true);
      // 4. Act: every planned key that is not backing off or parked. A key no longer planned
      //    has converged or gone: its failure and backoff no longer apply.
      const released = failures.retain(new Set([PASS_KEY, ...actions.map((a) => a.key)]));
      for (const key of released) this.timers.clear(key);
      if (released.length > 0 && loop.released) await loop.released(released, ctx);
      const now = clock.now();
      const eligible = actions.filter((a) => !failures.blocked(a.key, generation, now));
      if (eligible.length > 0) await this.#applyActions(eligible, ctx, generation);
      if (eligible.length > 0 && loop.afterActions && !this.#host.stopped()) {
        try {
          await loop.afterActions(ctx);
        } catch (error) {
          failed = true;
          this.#settleKey(PASS_KEY, { error }, generation);
        }
      }
    } finally {
      // 5. Report: loop-level conditions, counters, and status to listeners and dependents.
      const entries = failures.entries();
      const passFailure = entries.find(([k]) => k === PASS_KEY)?.[1] ?? null;
      for (const c of loopConditions(
        passFailure,
        entries.filter(([k]) => k !== PASS_KEY),
        generation,
      ))
        this.status.store.setLoopCondition(c);
      this.counters.lastPassDurationMs = clock.now() - t0;
      this.#settled(generation, !failed);
      this.status.flush();
    }
  }

  /** The pass has settled: its status goes out, and dependents may run on it. */
  #settled(generation: number, observed: boolean): void {
    if (this.settling.settle(generation, observed)) this.status.release();
  }

  async #applyActions(actions: Action<unknown>[], ctx: LoopContext, generation: number): Promise<void> {
    const { loop } = this;
    const { apply, applyBatch } = loop;
    const stopped = (): boolean => this.#host.stopped();
    if (applyBatch !== undefined) {
      const results = await this.actions.add(async () => {
        if (stopped()) return SKIPPED;
        try {
          return await applyBatch.call(loop, actions, ctx);
        } catch (error) {
          return new Map<string, BatchOutcome>(actions.map((a) => [a.key, { error }]));
        }
      });
      if (results === SKIPPED || results === undefined) return;
      for (const a of actions) {
        const outcome = results.get(a.key) ?? { error: new Error(`applyBatch returned no outcome for ${a.key}`) };
        this.#settleKey(a.key, outcome, generation, a);
      }
      return;
    }
    if (apply === undefined) return;
    await Promise.all(
      actions.map(async (a) => {
        const outcome = await this.actions.add(async (): Promise<BatchOutcome | typeof SKIPPED> => {
          if (stopped()) return SKIPPED;
          try {
            return await apply.call(loop, a, ctx);
          } catch (error) {
            return { error };
          }
        });
        if (outcome !== SKIPPED && outcome !== undefined) this.#settleKey(a.key, outcome, generation, a);
      }),
    );
  }

  /**
   * The one place an outcome takes effect, for an action's key or for the pass (PASS_KEY, no
   * `action`): one timer operation on the key and one counter, as controller-runtime's
   * reconcile handler does. Error: count an error, retry after the key's backoff.
   * TerminalError: count an error, no retry until the generation changes. Requeue: count an
   * applied action, come back after the delay. Done: count an applied action (a pass is
   * counted when it starts), nothing to come back for.
   */
  #settleKey(key: string, outcome: BatchOutcome, generation: number, action?: Action<unknown>): void {
    if (typeof outcome === 'object' && 'error' in outcome) {
      this.counters.errors++;
      const f = this.#failures.fail(key, outcome.error, generation, this.#host.clock.now());
      if (f.delayMs === null) this.timers.clear(key);
      else this.#wakeAfter(key, f.delayMs);
      const fields = { err: outcome.error, attempts: f.attempts };
      if (action === undefined) this.#host.logger.warn({ loop: this.loop.name, ...fields, retryInMs: f.delayMs }, 'reconcile pass failed');
      else if (f.delayMs === null)
        this.#actionLog(action).error(fields, `${action.summary}: failed, not retrying until the next generation`);
      else this.#actionLog(action).warn({ ...fields, retryInMs: f.delayMs }, `${action.summary}: failed`);
      return;
    }
    this.#failures.succeed(key);
    if (outcome === 'done') this.timers.clear(key);
    else this.#wakeAfter(key, Number.isFinite(outcome.requeueAfterMs) ? Math.max(0, outcome.requeueAfterMs) : 0);
    if (action === undefined) return;
    this.counters.actionsApplied++;
    this.#actionLog(action).info(action.summary);
  }

  /** Sets the key's timer to trigger a pass; none once stopped. */
  #wakeAfter(key: string, ms: number): void {
    if (this.#host.stopped()) return;
    this.timers.set(key, ms, () => void this.passes.trigger());
  }

  #actionLog(action: Action<unknown>): pino.Logger {
    return this.#host.logger.child({ loop: this.loop.name, key: action.key, kind: action.kind });
  }

  /** Failing action keys, then PASS_KEY when the pass itself failed. */
  #failureInfo(): Record<string, FailureInfo> {
    const { [PASS_KEY]: pass, ...actions } = this.#failures.info();
    return pass === undefined ? actions : { ...actions, [PASS_KEY]: pass };
  }
}
