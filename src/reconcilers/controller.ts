// The shared controller that drives every reconcile loop.
//
// A pass of one loop: read the spec → desired (pure) → observe → plan (pure) → apply the
// eligible actions on the loop's own queue → report Ready/Degraded. Passes of one loop never
// overlap; a trigger during a pass schedules exactly one more (pass-queue.ts). Every outcome,
// of an action or of the pass itself, goes through one switch (#settleKey): an error backs the
// key off on its own timer (backoff.ts) and passes skip it until then, so it never blocks other
// keys; a TerminalError parks it until the next generation; a requeue sets its timer; done
// clears it.
//
// Order between loops, all of it:
// - start(): each loop's start() runs in dependency order (loop-graph.ts), one after another;
//   no pass runs before all have returned. stop() closes them in the reverse order, once the
//   actions in flight have finished.
// - Triggers: notify() and the periodic resync trigger every loop; a loop's status changes
//   trigger the loops that depend on it and read it (triggeredBy) and those that watch it;
//   per-key timers and a loop's own handle.trigger() trigger that loop.
// - Gate: whatever triggered it, a pass starts only once each loop it dependsOn has settled a
//   pass that read the generation current at that moment (settling.ts), never waiting for the
//   passes they queue afterwards. A loop settles when its actions are applied, or after
//   planning (settlesAfter: 'plan'); its status changes go out at that moment (status.ts
//   StatusFeed), which is what triggers its dependents again.
// So a loop that is slow or always busy (the TLS loop with hundreds of domains whose DNS is not
// there yet) cannot hold back the others, and each loop applies on its own queue.

import PQueue from 'p-queue';
import pino from 'pino';
import { ProxyError } from '../errors.js';
import type { ProxyState } from '../spec/types.js';
import { backoffPolicy, type BackoffPolicy } from './backoff.js';
import { KeyTimers, systemClock, type Clock, type TimerHandle } from '../clock.js';
import { FailureBook, loopConditions } from './failures.js';
import { assertUniqueKeys, badOption, orderLoops } from './loop-graph.js';
import { PassQueue } from './pass-queue.js';
import { settledAll, Settling } from './settling.js';
import { readOnlyWriter, StatusFeed } from './status.js';
import type { Action, AnyLoop, BatchOutcome, FailureInfo, LoopContext, LoopCounters, LoopStatus, StatusSnapshot } from './types.js';

export interface SpecSnapshot {
  state: ProxyState;
  generation: number;
}

export interface ControllerOptions {
  loops: readonly AnyLoop[];
  /** The current spec; read at the start of every pass. */
  getSpec: () => SpecSnapshot;
  clock?: Clock;
  /** Actions applied at once, per loop (a loop may ask for fewer). Default 4. */
  concurrency?: number;
  /** Every loop runs at least this often, to repair drift. Default 60_000 (60 s). */
  resyncIntervalMs?: number;
  /** Per-key retry backoff; defaults in backoff.ts (1 s × 2^n, cap 5 min, ±20 % jitter). */
  backoff?: Partial<BackoffPolicy>;
  /** For jitter; tests pass a fixed one. Default Math.random. */
  random?: () => number;
  logger?: pino.Logger;
}

export type StatusListener = (loop: string, status: LoopStatus) => void;

interface Runtime {
  loop: AnyLoop;
  /** Single flight plus one pending pass. */
  passes: PassQueue;
  /** The loop's action queue (its concurrency). */
  actions: PQueue;
  status: StatusFeed;
  /** Failing keys: action keys, and PASS_KEY while the pass itself fails. */
  failures: FailureBook;
  /** One wake-up per key: its retry after a failure, or its requeue. */
  timers: KeyTimers;
  settling: Settling;
  /** The generation of the pass running or last run (status writes default to it). */
  generation: number;
  counters: LoopCounters;
}

/** The key under which a failing pass (desired/observe/plan threw) appears in LoopStatus.failures. */
export const PASS_KEY = '(pass)';
const SKIPPED = Symbol('skipped');

export class Controller {
  readonly #runtimes: readonly Runtime[]; // in dependency order
  /** Per loop: the loops its status changes trigger (dependents that read it, and watchers). */
  readonly #triggers = new Map<Runtime, readonly Runtime[]>();
  /** Per loop: the loops it waits for before a pass. */
  readonly #dependencies = new Map<Runtime, readonly Runtime[]>();
  readonly #getSpec: () => SpecSnapshot;
  readonly #clock: Clock;
  readonly #concurrency: number;
  readonly #resyncIntervalMs: number;
  readonly #logger: pino.Logger;
  readonly #listeners = new Set<StatusListener>();
  #resyncTimer: TimerHandle | null = null;
  /** Loops' start() calls; passes wait for them. */
  #starting: Promise<void> | null = null;
  #started = false;
  #stopped = false;
  #stopping: Promise<void> | null = null;

  constructor(opts: ControllerOptions) {
    const { loops, getSpec, clock = systemClock, concurrency = 4, resyncIntervalMs = 60_000 } = opts;
    if (!Number.isInteger(concurrency) || concurrency < 1) badOption('concurrency must be an integer >= 1');
    if (!Number.isFinite(resyncIntervalMs) || resyncIntervalMs <= 0) badOption('resyncIntervalMs must be > 0');
    if (typeof getSpec !== 'function') badOption('getSpec must be a function');
    const policy = backoffPolicy(opts.backoff);
    this.#getSpec = getSpec;
    this.#clock = clock;
    this.#resyncIntervalMs = resyncIntervalMs;
    this.#logger = opts.logger ?? pino({ level: 'silent' });
    this.#concurrency = concurrency;

    this.#runtimes = orderLoops(loops).map((loop) => this.#runtime(loop, policy, opts.random));
    const byName = new Map(this.#runtimes.map((rt) => [rt.loop.name, rt]));
    const named = (names: readonly string[] | undefined): Runtime[] => (names ?? []).flatMap((n) => byName.get(n) ?? []);
    const triggers = new Map<Runtime, Set<Runtime>>(this.#runtimes.map((rt) => [rt, new Set()]));
    for (const rt of this.#runtimes) {
      const triggeredBy = rt.loop.triggeredBy ?? rt.loop.dependsOn ?? [];
      for (const dep of named(rt.loop.dependsOn)) if (triggeredBy.includes(dep.loop.name)) triggers.get(dep)!.add(rt);
      this.#dependencies.set(rt, named(rt.loop.dependsOn));
    }
    for (const rt of this.#runtimes) for (const w of named(rt.loop.watches)) triggers.get(w)!.add(rt);
    for (const [rt, set] of triggers) this.#triggers.set(rt, [...set]);
  }

  /**
   * Starts every loop (dependency order), then the periodic resync, and runs every loop once;
   * resolves when that first round is done. A loop whose start() fails fails this call.
   */
  start(): Promise<void> {
    if (this.#stopped) return Promise.reject(new ProxyError('DP_ERR_INTERNAL', 'controller is stopped'));
    if (!this.#started) {
      this.#started = true;
      this.#starting = this.#startLoops();
    }
    return this.reconcileAll();
  }

  async #startLoops(): Promise<void> {
    for (const rt of this.#runtimes) {
      await rt.loop.start?.({ status: rt.status.store.writer(), trigger: () => void rt.passes.trigger() });
    }
    this.#scheduleResync();
  }

  /** A new generation was stored: run every loop (dependencies first). */
  notify(): void {
    void this.reconcileAll();
  }

  /**
   * Runs every loop once; resolves when all are done. Each pass starts once the loops it
   * depends on have settled theirs, not once they are done. A pass already running that has
   * not yet read the spec counts as the one pass.
   */
  reconcileAll(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    // Before the loops have started, a pass could only fail on resources they acquire at start.
    if (this.#starting !== null) {
      const starting = this.#starting;
      return starting.then(() => {
        if (this.#starting === starting) this.#starting = null;
        return this.reconcileAll();
      });
    }
    return Promise.all(this.#runtimes.map((rt) => rt.passes.trigger())).then(() => undefined);
  }

  /**
   * Resolves once every loop has settled a pass that read the generation current at this
   * call (a loop with nothing running or pending counts as settled). Unlike reconcileAll it
   * does not wait for actions of loops that settle after planning (certbot runs).
   */
  whenSettled(): Promise<void> {
    const starting = this.#starting ?? Promise.resolve();
    return starting.then(() => settledAll(this.#runtimes, this.#currentGeneration(), () => this.#stopped));
  }

  /** Resolves once no pass is running or pending (timers may still be set). */
  async whenIdle(): Promise<void> {
    for (;;) {
      await new Promise<void>((r) => setImmediate(r)); // let queued status flushes run
      const busy = this.#runtimes.flatMap((rt) => rt.passes.inFlight());
      if (busy.length === 0) return;
      await Promise.all(busy);
    }
  }

  /**
   * Stops timers and triggers, lets in-flight actions finish, skips actions not yet started,
   * then closes every loop in reverse dependency order (a close that fails is logged). Closes
   * each loop once, however often it is called.
   */
  stop(): Promise<void> {
    this.#stopping ??= this.#drain();
    return this.#stopping;
  }

  /** Every loop's status; a deep copy. */
  statuses(): StatusSnapshot {
    const loops: Record<string, LoopStatus> = {};
    for (const rt of this.#runtimes) loops[rt.loop.name] = rt.status.store.snapshot(failureInfo(rt));
    const observedGeneration = Math.min(...this.#runtimes.map((rt) => rt.settling.observedGeneration));
    return { generation: this.#getSpec().generation, observedGeneration: Number.isFinite(observedGeneration) ? Math.max(0, observedGeneration) : 0, loops };
  }

  /** Called with a loop's new status whenever it changed; returns an unsubscribe function. */
  onStatus(listener: StatusListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  counters(): Record<string, LoopCounters> {
    return Object.fromEntries(this.#runtimes.map((rt) => [rt.loop.name, { ...rt.counters }]));
  }

  /** What each loop would do for `state`, applying nothing and writing no status. */
  async dryRun(state: ProxyState): Promise<Record<string, Action<unknown>[]>> {
    const out: Record<string, Action<unknown>[]> = {};
    const statuses = this.statuses();
    for (const rt of this.#runtimes) {
      const ctx: LoopContext = { ...this.#context(rt), status: readOnlyWriter(rt.status.store.writer()) };
      const observed = await rt.loop.observe(ctx);
      out[rt.loop.name] = rt.loop.plan(rt.loop.desired(state, statuses), observed);
    }
    return out;
  }

  // ── timers and shutdown ───────────────────────────────────────────────────────────────

  #scheduleResync(): void {
    if (this.#stopped) return;
    this.#resyncTimer = this.#clock.setTimeout(() => {
      this.#resyncTimer = null;
      this.#logger.debug('resync');
      for (const rt of this.#runtimes) void rt.passes.trigger();
      this.#scheduleResync();
    }, this.#resyncIntervalMs);
  }

  async #drain(): Promise<void> {
    this.#stopped = true;
    if (this.#resyncTimer !== null) this.#clock.clearTimeout(this.#resyncTimer);
    this.#resyncTimer = null;
    for (const rt of this.#runtimes) {
      rt.timers.clearAll();
      rt.passes.stop();
      rt.settling.wake();
    }
    await Promise.all(this.#runtimes.map((rt) => rt.passes.running));
    await Promise.all(this.#runtimes.map((rt) => rt.actions.onIdle()));
    await this.#starting?.catch(() => undefined);
    for (const rt of [...this.#runtimes].reverse()) {
      try {
        await rt.loop.close?.();
      } catch (err) {
        this.#logger.warn({ err, loop: rt.loop.name }, 'closing a loop failed');
      }
    }
  }

  // ── one pass ──────────────────────────────────────────────────────────────────────────

  async #pass(rt: Runtime): Promise<void> {
    // 0. The gate: the loops this one depends on have settled a pass of the current
    //    generation (Nginx: the balancer sockets its sites point at exist). The pass reads
    //    everything after that, so it also covers any trigger that arrived meanwhile (the
    //    dependency's own status change, typically).
    const deps = this.#dependencies.get(rt) ?? [];
    if (deps.length > 0) await settledAll(deps, this.#currentGeneration(), () => this.#stopped);
    const covered = rt.passes.claim();
    try {
      await this.#steps(rt);
    } finally {
      covered?.resolve();
    }
  }

  async #steps(rt: Runtime): Promise<void> {
    const t0 = this.#clock.now();
    rt.status.hold();
    rt.settling.begin();
    rt.counters.passes++;
    let generation = rt.generation;
    let failed = false;
    try {
      let actions: Action<unknown>[];
      const ctx = this.#context(rt);
      try {
        // 1. Desired: what the spec and the other loops' status ask for (pure).
        const spec = this.#getSpec();
        generation = rt.generation = ctx.generation = spec.generation;
        const desired = rt.loop.desired(spec.state, this.statuses());
        // 2. Observe: what the world looks like now.
        const observed = await rt.loop.observe(ctx);
        // 3. Compare: the actions that close the gap (pure).
        actions = rt.loop.plan(desired, observed);
        assertUniqueKeys(rt.loop.name, actions);
        this.#settleKey(rt, PASS_KEY, 'done', generation);
      } catch (error) {
        failed = true;
        this.#settleKey(rt, PASS_KEY, { error }, generation);
        return;
      }
      // What a dependent of a loop that settles after planning reads is there now; results
      // of the actions below reach it as status changes (each triggers it again).
      if (rt.loop.settlesAfter === 'plan') this.#settled(rt, generation, true);
      // 4. Act: every planned key that is not backing off or parked. A key no longer planned
      //    has converged or gone: its failure and backoff no longer apply.
      const released = rt.failures.retain(new Set([PASS_KEY, ...actions.map((a) => a.key)]));
      for (const key of released) rt.timers.clear(key);
      if (released.length > 0 && rt.loop.released) await rt.loop.released(released, ctx);
      const now = this.#clock.now();
      const eligible = actions.filter((a) => !rt.failures.blocked(a.key, generation, now));
      if (eligible.length > 0) await this.#applyActions(rt, eligible, ctx, generation);
      if (eligible.length > 0 && rt.loop.afterActions && !this.#stopped) {
        try {
          await rt.loop.afterActions(ctx);
        } catch (error) {
          failed = true;
          this.#settleKey(rt, PASS_KEY, { error }, generation);
        }
      }
    } finally {
      // 5. Report: loop-level conditions, counters, and status to listeners and dependents.
      const entries = rt.failures.entries();
      const passFailure = entries.find(([k]) => k === PASS_KEY)?.[1] ?? null;
      for (const c of loopConditions(passFailure, entries.filter(([k]) => k !== PASS_KEY), generation)) rt.status.store.setLoopCondition(c);
      rt.counters.lastPassDurationMs = this.#clock.now() - t0;
      this.#settled(rt, generation, !failed);
      rt.status.flush();
    }
  }

  /** The pass of `rt` has settled: its status goes out, and dependents may run on it. */
  #settled(rt: Runtime, generation: number, observed: boolean): void {
    if (rt.settling.settle(generation, observed)) rt.status.release();
  }

  #currentGeneration(): number {
    try {
      return this.#getSpec().generation;
    } catch {
      return -1; // the pass will fail on it too; wait for nothing
    }
  }

  async #applyActions(rt: Runtime, actions: Action<unknown>[], ctx: LoopContext, generation: number): Promise<void> {
    const { apply, applyBatch } = rt.loop;
    if (applyBatch !== undefined) {
      const results = await rt.actions.add(async () => {
        if (this.#stopped) return SKIPPED;
        try {
          return await applyBatch.call(rt.loop, actions, ctx);
        } catch (error) {
          return new Map<string, BatchOutcome>(actions.map((a) => [a.key, { error }]));
        }
      });
      if (results === SKIPPED || results === undefined) return;
      for (const a of actions) {
        const outcome = results.get(a.key) ?? { error: new Error(`applyBatch returned no outcome for ${a.key}`) };
        this.#settleKey(rt, a.key, outcome, generation, a);
      }
      return;
    }
    if (apply === undefined) return;
    await Promise.all(
      actions.map(async (a) => {
        const outcome = await rt.actions.add(async (): Promise<BatchOutcome | typeof SKIPPED> => {
          if (this.#stopped) return SKIPPED;
          try {
            return await apply.call(rt.loop, a, ctx);
          } catch (error) {
            return { error };
          }
        });
        if (outcome !== SKIPPED && outcome !== undefined) this.#settleKey(rt, a.key, outcome, generation, a);
      }),
    );
  }

  /**
   * The one place an outcome takes effect, for an action's key or for the pass (PASS_KEY, no
   * `action`): one timer operation on the key and one counter. Error: count an error, retry
   * after the key's backoff. TerminalError: count an error, no retry until the generation
   * changes. Requeue: count an applied action, come back after the delay. Done: count an
   * applied action (a pass is counted when it starts), nothing to come back for.
   */
  #settleKey(rt: Runtime, key: string, outcome: BatchOutcome, generation: number, action?: Action<unknown>): void {
    if (typeof outcome === 'object' && 'error' in outcome) {
      rt.counters.errors++;
      const f = rt.failures.fail(key, outcome.error, generation, this.#clock.now());
      if (f.delayMs === null) rt.timers.clear(key);
      else this.#wakeAfter(rt, key, f.delayMs);
      const fields = { err: outcome.error, attempts: f.attempts };
      if (action === undefined) this.#logger.warn({ loop: rt.loop.name, ...fields, retryInMs: f.delayMs }, 'reconcile pass failed');
      else if (f.delayMs === null) this.#actionLog(rt, action).error(fields, `${action.summary}: failed, not retrying until the next generation`);
      else this.#actionLog(rt, action).warn({ ...fields, retryInMs: f.delayMs }, `${action.summary}: failed`);
      return;
    }
    rt.failures.succeed(key);
    if (outcome === 'done') rt.timers.clear(key);
    else this.#wakeAfter(rt, key, Number.isFinite(outcome.requeueAfterMs) ? Math.max(0, outcome.requeueAfterMs) : 0);
    if (action === undefined) return;
    rt.counters.actionsApplied++;
    this.#actionLog(rt, action).info(action.summary);
  }

  /** Sets the key's timer to trigger a pass of `rt`; none once stopped. */
  #wakeAfter(rt: Runtime, key: string, ms: number): void {
    if (this.#stopped) return;
    rt.timers.set(key, ms, () => void rt.passes.trigger());
  }

  #actionLog(rt: Runtime, action: Action<unknown>): pino.Logger {
    return this.#logger.child({ loop: rt.loop.name, key: action.key, kind: action.kind });
  }

  // ── status ────────────────────────────────────────────────────────────────────────────

  #publish(rt: Runtime): void {
    const status = rt.status.store.snapshot(failureInfo(rt));
    for (const listener of this.#listeners) {
      try {
        listener(rt.loop.name, status);
      } catch (err) {
        this.#logger.error({ err, loop: rt.loop.name }, 'status listener threw');
      }
    }
    for (const other of this.#triggers.get(rt) ?? []) void other.passes.trigger();
  }

  #runtime(loop: AnyLoop, policy: BackoffPolicy, random: (() => number) | undefined): Runtime {
    const concurrency = loop.concurrency ?? this.#concurrency;
    if (!Number.isInteger(concurrency) || concurrency < 1) badOption(`loop ${loop.name}: concurrency must be an integer >= 1`);
    const rt: Runtime = {
      loop,
      passes: new PassQueue(
        () => this.#pass(rt).catch((err: unknown) => this.#logger.error({ err, loop: loop.name }, 'reconcile pass crashed')),
        () => rt.settling.wake(),
      ),
      actions: new PQueue({ concurrency }),
      status: new StatusFeed({ now: () => this.#clock.now(), generation: () => rt.generation, publish: () => this.#publish(rt) }),
      failures: new FailureBook(policy, random),
      timers: new KeyTimers(this.#clock),
      settling: new Settling(),
      generation: 0,
      counters: { passes: 0, errors: 0, actionsApplied: 0, lastPassDurationMs: 0 },
    };
    return rt;
  }

  #context(rt: Runtime): LoopContext {
    return {
      generation: rt.generation,
      status: rt.status.store.writer(),
      clock: this.#clock,
      logger: this.#logger.child({ loop: rt.loop.name }),
    };
  }
}

/** Failing action keys, then PASS_KEY when the pass itself failed. */
function failureInfo(rt: Runtime): Record<string, FailureInfo> {
  const { [PASS_KEY]: pass, ...actions } = rt.failures.info();
  return pass === undefined ? actions : { ...actions, [PASS_KEY]: pass };
}
