// The shared controller that drives every reconcile loop.
//
// A pass of one loop: read the spec → desired (pure) → observe → plan (pure) → apply the
// eligible actions on the loop's own queue → report Ready/Degraded. Passes of one loop never
// overlap; a trigger during a pass schedules exactly one more. Triggers: notify() (new
// generation), a status change of a loop this one dependsOn (those it is triggeredBy) or
// watches, the periodic resync, and per-key retry/requeue timers. A failing key backs off on its own timer (backoff.ts) and
// is skipped by passes until then, so it never blocks other keys; a TerminalError parks a key
// until the next generation.
//
// A dependent waits for its dependencies only until each has settled one pass that read the
// generation it is about to read, never for the passes they queue afterwards, and each loop
// applies its actions on its own queue: a loop that is slow or always busy (the TLS loop with
// hundreds of domains whose DNS is not there yet) cannot hold back the others.

import PQueue from 'p-queue';
import pino from 'pino';
import { ProxyError } from '../errors.js';
import type { ProxyState } from '../spec/types.js';
import { backoffPolicy, type BackoffPolicy } from './backoff.js';
import { KeyTimers, systemClock, type Clock, type TimerHandle } from '../clock.js';
import { FailureBook, loopConditions } from './failures.js';
import { assertUniqueKeys, badOption, orderLoops } from './loop-graph.js';
import { readOnlyWriter, StatusStore } from './status.js';
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

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
}

interface Runtime {
  loop: AnyLoop;
  /** Loops that depend on this one and read its status: triggered by its status changes. */
  dependents: Runtime[];
  /** Loops that watch this one: triggered by its status changes, never waited for. */
  watchers: Runtime[];
  queue: PQueue;
  status: StatusStore;
  /** Failing action keys, and the retry timer of each. */
  failures: FailureBook;
  retryTimers: KeyTimers;
  requeueTimers: KeyTimers;
  /** A failing pass (desired/observe/plan threw), under PASS_KEY, and its retry timer. */
  passFailures: FailureBook;
  passTimer: KeyTimers;
  running: Promise<void> | null;
  pending: Deferred | null;
  started: number;
  /** Status changes are held back (flushed once) until the pass has settled. */
  holdStatus: boolean;
  settledThisPass: boolean;
  /** Generation read by the last pass that settled (failed or not). */
  settledGeneration: number;
  /** Generation read by the last pass that settled without failing as a whole. */
  observedGeneration: number;
  /** Resolved (and replaced) whenever a pass settles or ends. */
  settleSignal: Deferred;
  statusDirty: boolean;
  flushScheduled: boolean;
  generation: number;
  counters: LoopCounters;
}

/** The key under which a failing pass (desired/observe/plan threw) appears in LoopStatus.failures. */
export const PASS_KEY = '(pass)';
const SKIPPED = Symbol('skipped');

export class Controller {
  readonly #runtimes: readonly Runtime[]; // in dependency order
  readonly #byName = new Map<string, Runtime>();
  readonly #getSpec: () => SpecSnapshot;
  readonly #clock: Clock;
  readonly #concurrency: number;
  readonly #resyncIntervalMs: number;
  readonly #logger: pino.Logger;
  readonly #listeners = new Set<StatusListener>();
  #resyncTimer: TimerHandle | null = null;
  #started = false;
  /** Loops' start() calls; passes wait for them. */
  #starting: Promise<void> | null = null;
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
    for (const rt of this.#runtimes) this.#byName.set(rt.loop.name, rt);
    for (const rt of this.#runtimes) {
      const triggeredBy = rt.loop.triggeredBy ?? rt.loop.dependsOn ?? [];
      for (const dep of rt.loop.dependsOn ?? []) if (triggeredBy.includes(dep)) this.#byName.get(dep)?.dependents.push(rt);
      for (const w of rt.loop.watches ?? []) this.#byName.get(w)?.watchers.push(rt);
    }
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
      await rt.loop.start?.({ status: rt.status.writer(), trigger: () => void this.#trigger(rt) });
    }
    this.#scheduleResync();
  }

  /** A new generation was stored: run every loop (dependencies first). */
  notify(): void {
    void this.reconcileAll();
  }

  /**
   * Runs every loop once; resolves when all are done. Each pass starts once the loops it
   * depends on have settled theirs (see #dependenciesSettled), not once they are done.
   * A pass already running that started after this call counts as the one pass.
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
    const passes = this.#runtimes.map((rt) => this.#passAfter(rt, rt.started));
    return Promise.all(passes).then(() => undefined);
  }

  /**
   * Resolves once every loop has settled a pass that read the generation current at this
   * call (a loop with nothing running or pending counts as settled). Unlike reconcileAll it
   * does not wait for actions of loops that settle after planning (certbot runs).
   */
  whenSettled(): Promise<void> {
    const starting = this.#starting ?? Promise.resolve();
    return starting.then(() => this.#settledAll(this.#runtimes, this.#currentGeneration()));
  }

  /** Alias of reconcileAll. */
  runOnce(): Promise<void> {
    return this.reconcileAll();
  }

  /** Resolves once no pass is running or pending (timers may still be set). */
  async whenIdle(): Promise<void> {
    for (;;) {
      await new Promise<void>((r) => setImmediate(r)); // let queued status flushes run
      const busy = this.#runtimes.flatMap((rt) => [rt.running, rt.pending?.promise]).filter((p) => p != null);
      if (busy.length === 0) return;
      await Promise.all(busy);
    }
  }

  /**
   * Stops timers and triggers, lets in-flight actions finish, skips actions not yet started,
   * then closes every loop in reverse dependency order (a close that fails is logged).
   */
  stop(): Promise<void> {
    this.#stopping ??= this.#drain();
    return this.#stopping;
  }

  /** Every loop's status; a deep copy. */
  statuses(): StatusSnapshot {
    const loops: Record<string, LoopStatus> = {};
    for (const rt of this.#runtimes) loops[rt.loop.name] = rt.status.snapshot(failureInfo(rt));
    const observedGeneration = Math.min(...this.#runtimes.map((rt) => rt.observedGeneration));
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
      const ctx: LoopContext = { ...this.#context(rt), status: readOnlyWriter(rt.status.writer()) };
      const observed = await rt.loop.observe(ctx);
      out[rt.loop.name] = rt.loop.plan(rt.loop.desired(state, statuses), observed);
    }
    return out;
  }

  // ── scheduling ────────────────────────────────────────────────────────────────────────

  #trigger(rt: Runtime): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    rt.pending ??= deferred();
    const p = rt.pending.promise;
    if (rt.running === null) this.#startPass(rt);
    return p;
  }

  #passAfter(rt: Runtime, seq: number): Promise<void> {
    if (rt.started > seq) return rt.running ?? Promise.resolve();
    return this.#trigger(rt);
  }

  #startPass(rt: Runtime): void {
    const d = rt.pending ?? deferred();
    rt.pending = null;
    rt.started++;
    const pass = this.#pass(rt).catch((err: unknown) => this.#logger.error({ err, loop: rt.loop.name }, 'reconcile pass crashed'));
    rt.running = pass.then(() => {
      rt.running = null;
      d.resolve();
      if (rt.pending !== null) {
        if (this.#stopped) {
          rt.pending.resolve();
          rt.pending = null;
        } else {
          this.#startPass(rt);
        }
      }
      signal(rt);
    });
  }

  #scheduleResync(): void {
    if (this.#stopped) return;
    this.#resyncTimer = this.#clock.setTimeout(() => {
      this.#resyncTimer = null;
      this.#logger.debug('resync');
      for (const rt of this.#runtimes) void this.#trigger(rt);
      this.#scheduleResync();
    }, this.#resyncIntervalMs);
  }

  /** Sets a timer that triggers a pass of `rt`; none once stopped. */
  #retriggerAfter(timers: KeyTimers, rt: Runtime, key: string, ms: number): void {
    if (this.#stopped) return;
    timers.set(key, ms, () => void this.#trigger(rt));
  }

  async #drain(): Promise<void> {
    this.#stopped = true;
    if (this.#resyncTimer !== null) this.#clock.clearTimeout(this.#resyncTimer);
    this.#resyncTimer = null;
    for (const rt of this.#runtimes) {
      for (const timers of [rt.retryTimers, rt.requeueTimers, rt.passTimer]) timers.clearAll();
      if (rt.running === null && rt.pending !== null) {
        rt.pending.resolve();
        rt.pending = null;
      }
      signal(rt);
    }
    await Promise.all(this.#runtimes.map((rt) => rt.running));
    await Promise.all(this.#runtimes.map((rt) => rt.queue.onIdle()));
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
    // 0. A pass starts once the loops this one depends on have settled a pass of the current
    //    generation (Nginx: the balancer sockets its sites point at exist), whatever
    //    triggered it. It reads everything after that, so it also counts as the pass of any
    //    trigger that arrived meanwhile (the dependency's own status change, typically).
    await this.#dependenciesSettled(rt);
    const covered = rt.pending;
    rt.pending = null;
    try {
      await this.#steps(rt);
    } finally {
      covered?.resolve();
    }
  }

  async #steps(rt: Runtime): Promise<void> {
    const t0 = this.#clock.now();
    rt.holdStatus = true;
    rt.settledThisPass = false;
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
        rt.passFailures.succeed(PASS_KEY);
        rt.passTimer.clear(PASS_KEY);
      } catch (err) {
        failed = true;
        this.#passFailed(rt, err, generation);
        return;
      }
      // What a dependent of a loop that settles after planning reads is there now; results
      // of the actions below reach it as status changes (each triggers it again).
      if (rt.loop.settlesAfter === 'plan') this.#settle(rt, generation, true);
      // 4. Act: every planned key that is not backing off or parked. A key no longer planned
      //    has converged or gone: its failure and backoff no longer apply.
      const released = rt.failures.retain(new Set(actions.map((a) => a.key)));
      for (const key of released) rt.retryTimers.clear(key);
      if (released.length > 0 && rt.loop.released) await rt.loop.released(released, ctx);
      const now = this.#clock.now();
      const eligible = actions.filter((a) => !rt.failures.blocked(a.key, generation, now));
      if (eligible.length > 0) await this.#applyActions(rt, eligible, ctx, generation);
      if (eligible.length > 0 && rt.loop.afterActions && !this.#stopped) {
        try {
          await rt.loop.afterActions(ctx);
        } catch (err) {
          failed = true;
          this.#passFailed(rt, err, generation);
        }
      }
    } finally {
      // 5. Report: loop-level conditions, counters, and status to listeners and dependents.
      const passFailure = rt.passFailures.entries()[0]?.[1] ?? null;
      for (const c of loopConditions(passFailure, rt.failures.entries(), generation)) rt.status.setLoopCondition(c);
      rt.counters.lastPassDurationMs = this.#clock.now() - t0;
      this.#settle(rt, generation, !failed);
      this.#flushStatus(rt);
    }
  }

  /** The pass of `rt` has settled: dependents may run on its status from now on. */
  #settle(rt: Runtime, generation: number, observed: boolean): void {
    if (rt.settledThisPass) return;
    rt.settledThisPass = true;
    rt.settledGeneration = Math.max(rt.settledGeneration, generation);
    if (observed) rt.observedGeneration = Math.max(rt.observedGeneration, generation);
    rt.holdStatus = false;
    this.#flushStatus(rt);
    signal(rt);
  }

  #currentGeneration(): number {
    try {
      return this.#getSpec().generation;
    } catch {
      return -1; // the pass will fail on it too; wait for nothing
    }
  }

  /**
   * Resolves once every loop in `deps` has settled a pass that read `generation` or a later
   * one, or has no pass running or pending. Passes a dependency queues after that one (its
   * own requeues, every few seconds for a TLS loop waiting on DNS) are not waited for.
   */
  async #settledAll(deps: readonly Runtime[], generation: number): Promise<void> {
    for (;;) {
      if (this.#stopped) return;
      const waiting = deps.filter((d) => d.settledGeneration < generation && (d.running !== null || d.pending !== null));
      if (waiting.length === 0) return;
      await Promise.race(waiting.map((d) => d.settleSignal.promise));
    }
  }

  #dependenciesSettled(rt: Runtime): Promise<void> {
    const deps = (rt.loop.dependsOn ?? []).flatMap((name) => this.#byName.get(name) ?? []);
    if (deps.length === 0) return Promise.resolve();
    return this.#settledAll(deps, this.#currentGeneration());
  }

  async #applyActions(rt: Runtime, actions: Action<unknown>[], ctx: LoopContext, generation: number): Promise<void> {
    const { apply, applyBatch } = rt.loop;
    if (applyBatch !== undefined) {
      const results = await rt.queue.add(async () => {
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
        this.#record(rt, a, outcome, generation);
      }
      return;
    }
    if (apply === undefined) return;
    await Promise.all(
      actions.map(async (a) => {
        const outcome = await rt.queue.add(async (): Promise<BatchOutcome | typeof SKIPPED> => {
          if (this.#stopped) return SKIPPED;
          try {
            return await apply.call(rt.loop, a, ctx);
          } catch (error) {
            return { error };
          }
        });
        if (outcome !== SKIPPED && outcome !== undefined) this.#record(rt, a, outcome, generation);
      }),
    );
  }

  #record(rt: Runtime, action: Action<unknown>, outcome: BatchOutcome, generation: number): void {
    const { key } = action;
    const log = this.#logger.child({ loop: rt.loop.name, key, kind: action.kind });
    rt.retryTimers.clear(key);
    if (typeof outcome === 'object' && 'error' in outcome) {
      rt.counters.errors++;
      const f = rt.failures.fail(key, outcome.error, generation, this.#clock.now());
      if (f.delayMs === null) {
        log.error({ err: outcome.error, attempts: f.attempts }, `${action.summary}: failed, not retrying until the next generation`);
        return;
      }
      this.#retriggerAfter(rt.retryTimers, rt, key, f.delayMs);
      log.warn({ err: outcome.error, attempts: f.attempts, retryInMs: f.delayMs }, `${action.summary}: failed`);
      return;
    }
    rt.counters.actionsApplied++;
    rt.failures.succeed(key);
    if (typeof outcome === 'object') {
      const ms = Number.isFinite(outcome.requeueAfterMs) ? Math.max(0, outcome.requeueAfterMs) : 0;
      this.#retriggerAfter(rt.requeueTimers, rt, key, ms);
    }
    log.info(action.summary);
  }

  /** desired/observe/plan threw: retry the whole pass with backoff (not for a TerminalError). */
  #passFailed(rt: Runtime, err: unknown, generation: number): void {
    rt.counters.errors++;
    const f = rt.passFailures.fail(PASS_KEY, err, generation, this.#clock.now());
    if (f.delayMs !== null) this.#retriggerAfter(rt.passTimer, rt, PASS_KEY, f.delayMs);
    this.#logger.warn({ loop: rt.loop.name, err, attempts: f.attempts, retryInMs: f.delayMs }, 'reconcile pass failed');
  }

  // ── status ────────────────────────────────────────────────────────────────────────────

  #statusChanged(rt: Runtime): void {
    rt.statusDirty = true;
    if (rt.holdStatus || rt.flushScheduled) return;
    rt.flushScheduled = true;
    queueMicrotask(() => {
      rt.flushScheduled = false;
      if (!rt.holdStatus) this.#flushStatus(rt);
    });
  }

  #flushStatus(rt: Runtime): void {
    if (!rt.statusDirty) return;
    rt.statusDirty = false;
    const status = rt.status.snapshot(failureInfo(rt));
    for (const listener of this.#listeners) {
      try {
        listener(rt.loop.name, status);
      } catch (err) {
        this.#logger.error({ err, loop: rt.loop.name }, 'status listener threw');
      }
    }
    for (const other of new Set([...rt.dependents, ...rt.watchers])) void this.#trigger(other);
  }

  #runtime(loop: AnyLoop, policy: BackoffPolicy, random: (() => number) | undefined): Runtime {
    const concurrency = loop.concurrency ?? this.#concurrency;
    if (!Number.isInteger(concurrency) || concurrency < 1) badOption(`loop ${loop.name}: concurrency must be an integer >= 1`);
    const rt: Runtime = {
      loop,
      dependents: [],
      watchers: [],
      queue: new PQueue({ concurrency }),
      status: new StatusStore({
        now: () => this.#clock.now(),
        generation: () => rt.generation,
        onChange: () => this.#statusChanged(rt),
      }),
      failures: new FailureBook(policy, random),
      retryTimers: new KeyTimers(this.#clock),
      requeueTimers: new KeyTimers(this.#clock),
      passFailures: new FailureBook(policy, random),
      passTimer: new KeyTimers(this.#clock),
      running: null,
      pending: null,
      started: 0,
      holdStatus: false,
      settledThisPass: false,
      // -1: no pass settled yet (the first generation of a new gateway is 0).
      settledGeneration: -1,
      observedGeneration: -1,
      settleSignal: deferred(),
      statusDirty: false,
      flushScheduled: false,
      generation: 0,
      counters: { passes: 0, errors: 0, actionsApplied: 0, lastPassDurationMs: 0 },
    };
    return rt;
  }

  #context(rt: Runtime): LoopContext {
    return {
      generation: rt.generation,
      status: rt.status.writer(),
      clock: this.#clock,
      logger: this.#logger.child({ loop: rt.loop.name }),
    };
  }
}

function signal(rt: Runtime): void {
  const s = rt.settleSignal;
  rt.settleSignal = deferred();
  s.resolve();
}

function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** Failing action keys, plus PASS_KEY when the pass itself failed. */
function failureInfo(rt: Runtime): Record<string, FailureInfo> {
  return { ...rt.failures.info(), ...rt.passFailures.info() };
}
