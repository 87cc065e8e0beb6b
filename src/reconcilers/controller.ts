// The shared controller that drives every reconcile loop (DESIGN.md §3).
//
// A pass of one loop: read the spec → desired (pure) → observe → plan (pure) → apply the
// eligible actions on a shared p-queue → report Ready/Degraded. Passes of one loop never overlap;
// a trigger during a pass schedules exactly one more. Triggers: notify() (new generation), a
// status change of a loop this one dependsOn, the periodic resync, and per-key retry/requeue
// timers. A failing key backs off on its own timer (backoff.ts) and is skipped by passes until
// then, so it never blocks other keys; a TerminalError parks a key until the next generation.

import PQueue from 'p-queue';
import pino from 'pino';
import { ProxyError, TerminalError } from '../errors.js';
import type { ProxyState } from '../spec/types.js';
import { backoffPolicy, BackoffTracker, type BackoffPolicy } from './backoff.js';
import { systemClock, type Clock, type TimerHandle } from './clock.js';
import { readOnlyWriter, StatusStore } from './status.js';
import type {
  Action,
  AnyLoop,
  BatchOutcome,
  FailureInfo,
  LoopContext,
  LoopCounters,
  LoopStatus,
  StatusSnapshot,
} from './types.js';

export interface SpecSnapshot {
  state: ProxyState;
  generation: number;
}

export interface ControllerOptions {
  loops: readonly AnyLoop[];
  /** The current spec; read at the start of every pass. */
  getSpec: () => SpecSnapshot;
  clock?: Clock;
  /** Actions applied at once, across all loops. Default 4. */
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

interface Failure {
  message: string;
  attempts: number;
  terminal: boolean;
  generation: number;
  retryAt: number | null;
}

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
}

interface Runtime {
  loop: AnyLoop;
  dependents: Runtime[];
  status: StatusStore;
  backoff: BackoffTracker;
  failures: Map<string, Failure>;
  retryTimers: Map<string, TimerHandle>;
  requeueTimers: Map<string, TimerHandle>;
  passFailure: Failure | null;
  passRetryTimer: TimerHandle | null;
  running: Promise<void> | null;
  pending: Deferred | null;
  started: number;
  inPass: boolean;
  statusDirty: boolean;
  flushScheduled: boolean;
  generation: number;
  counters: LoopCounters;
}

const PASS_KEY = '(pass)';
const SKIPPED = Symbol('skipped');

export class Controller {
  readonly #runtimes: Runtime[]; // in dependency order
  readonly #byName = new Map<string, Runtime>();
  readonly #getSpec: () => SpecSnapshot;
  readonly #clock: Clock;
  readonly #queue: PQueue;
  readonly #resyncIntervalMs: number;
  readonly #logger: pino.Logger;
  readonly #listeners = new Set<StatusListener>();
  #resyncTimer: TimerHandle | null = null;
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
    this.#queue = new PQueue({ concurrency });

    for (const loop of loops) {
      if (this.#byName.has(loop.name)) badOption(`two loops are named ${loop.name}`);
      if (loop.apply === undefined && loop.applyBatch === undefined) badOption(`loop ${loop.name} has neither apply nor applyBatch`);
      const rt: Runtime = {
        loop,
        dependents: [],
        status: undefined as unknown as StatusStore,
        backoff: new BackoffTracker(policy, opts.random),
        failures: new Map(),
        retryTimers: new Map(),
        requeueTimers: new Map(),
        passFailure: null,
        passRetryTimer: null,
        running: null,
        pending: null,
        started: 0,
        inPass: false,
        statusDirty: false,
        flushScheduled: false,
        generation: 0,
        counters: { passes: 0, errors: 0, actionsApplied: 0, lastPassDurationMs: 0 },
      };
      rt.status = new StatusStore({
        now: () => this.#clock.now(),
        generation: () => rt.generation,
        onChange: () => this.#statusChanged(rt),
      });
      this.#byName.set(loop.name, rt);
    }
    for (const rt of this.#byName.values()) {
      for (const dep of rt.loop.dependsOn ?? []) {
        const d = this.#byName.get(dep);
        if (d === undefined) badOption(`loop ${rt.loop.name} depends on unknown loop ${dep}`);
        else d.dependents.push(rt);
      }
    }
    this.#runtimes = topoOrder([...this.#byName.values()], this.#byName);
  }

  /** Starts the periodic resync and runs every loop once; resolves when that first round is done. */
  start(): Promise<void> {
    if (this.#stopped) return Promise.reject(new ProxyError('DP_ERR_INTERNAL', 'controller is stopped'));
    if (!this.#started) {
      this.#started = true;
      this.#scheduleResync();
    }
    return this.reconcileAll();
  }

  /** A new generation was stored: run every loop (dependencies first). */
  notify(): void {
    void this.reconcileAll();
  }

  /**
   * Runs every loop once, each after the loops it depends on; resolves when all are done.
   * A pass already running that started after this call counts as the one pass.
   */
  reconcileAll(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    const done = new Map<string, Promise<void>>();
    for (const rt of this.#runtimes) {
      const seq = rt.started;
      const deps = (rt.loop.dependsOn ?? []).map((d) => done.get(d) ?? Promise.resolve());
      done.set(rt.loop.name, Promise.all(deps).then(() => this.#passAfter(rt, seq)));
    }
    return Promise.all(done.values()).then(() => undefined);
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

  /** Stops timers and triggers, lets in-flight actions finish, skips actions not yet started. */
  stop(): Promise<void> {
    this.#stopping ??= this.#drain();
    return this.#stopping;
  }

  /** Every loop's status; a deep copy. */
  statuses(): StatusSnapshot {
    const loops: Record<string, LoopStatus> = {};
    for (const rt of this.#runtimes) loops[rt.loop.name] = rt.status.snapshot(this.#failureInfo(rt));
    return { generation: this.#getSpec().generation, loops };
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
    rt.running = this.#pass(rt).then(() => {
      rt.running = null;
      d.resolve();
      if (rt.pending === null) return;
      if (this.#stopped) {
        rt.pending.resolve();
        rt.pending = null;
      } else {
        this.#startPass(rt);
      }
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

  #setTimer(timers: Map<string, TimerHandle>, rt: Runtime, key: string, ms: number): void {
    this.#clearTimer(timers, key);
    if (this.#stopped) return;
    timers.set(
      key,
      this.#clock.setTimeout(() => {
        timers.delete(key);
        void this.#trigger(rt);
      }, ms),
    );
  }

  #clearTimer(timers: Map<string, TimerHandle>, key: string): void {
    const h = timers.get(key);
    if (h === undefined) return;
    this.#clock.clearTimeout(h);
    timers.delete(key);
  }

  async #drain(): Promise<void> {
    this.#stopped = true;
    if (this.#resyncTimer !== null) this.#clock.clearTimeout(this.#resyncTimer);
    this.#resyncTimer = null;
    for (const rt of this.#runtimes) {
      for (const timers of [rt.retryTimers, rt.requeueTimers]) for (const key of [...timers.keys()]) this.#clearTimer(timers, key);
      if (rt.passRetryTimer !== null) this.#clock.clearTimeout(rt.passRetryTimer);
      rt.passRetryTimer = null;
      if (rt.running === null && rt.pending !== null) {
        rt.pending.resolve();
        rt.pending = null;
      }
    }
    await Promise.all(this.#runtimes.map((rt) => rt.running));
    await this.#queue.onIdle();
  }

  // ── one pass ──────────────────────────────────────────────────────────────────────────

  async #pass(rt: Runtime): Promise<void> {
    const t0 = this.#clock.now();
    rt.inPass = true;
    rt.counters.passes++;
    const { state, generation } = this.#getSpec();
    rt.generation = generation;
    const ctx = this.#context(rt);
    try {
      let actions: Action<unknown>[];
      try {
        // 1. Desired: what the spec and the other loops' status ask for (pure).
        const desired = rt.loop.desired(state, this.statuses());
        // 2. Observe: what the world looks like now.
        const observed = await rt.loop.observe(ctx);
        // 3. Compare: the actions that close the gap (pure).
        actions = rt.loop.plan(desired, observed);
        assertUniqueKeys(rt.loop.name, actions);
        this.#passSucceeded(rt);
      } catch (err) {
        this.#passFailed(rt, err, generation);
        return;
      }
      // 4. Act: every planned key that is not backing off or parked.
      this.#forgetUnplanned(rt, new Set(actions.map((a) => a.key)));
      const now = this.#clock.now();
      const eligible = actions.filter((a) => !this.#blocked(rt, a.key, generation, now));
      if (eligible.length > 0) await this.#applyActions(rt, eligible, ctx, generation);
    } finally {
      // 5. Report: loop-level conditions, counters, and status to listeners and dependents.
      this.#reportLoop(rt, generation);
      rt.counters.lastPassDurationMs = this.#clock.now() - t0;
      rt.inPass = false;
      this.#flushStatus(rt);
    }
  }

  async #applyActions(rt: Runtime, actions: Action<unknown>[], ctx: LoopContext, generation: number): Promise<void> {
    const { apply, applyBatch } = rt.loop;
    if (applyBatch !== undefined) {
      const results = await this.#queue.add(async () => {
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
        const outcome = await this.#queue.add(async (): Promise<BatchOutcome | typeof SKIPPED> => {
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
    if (typeof outcome === 'object' && 'error' in outcome) {
      rt.counters.errors++;
      const err = outcome.error;
      const message = errorMessage(err);
      this.#clearTimer(rt.retryTimers, key);
      if (err instanceof TerminalError) {
        const attempts = rt.backoff.failure(key).attempts;
        rt.failures.set(key, { message, attempts, terminal: true, generation, retryAt: null });
        log.error({ err, attempts }, `${action.summary}: failed, not retrying until the next generation`);
        return;
      }
      const { attempts, delayMs } = rt.backoff.failure(key);
      rt.failures.set(key, { message, attempts, terminal: false, generation, retryAt: this.#clock.now() + delayMs });
      this.#setTimer(rt.retryTimers, rt, key, delayMs);
      log.warn({ err, attempts, retryInMs: delayMs }, `${action.summary}: failed`);
      return;
    }
    rt.counters.actionsApplied++;
    rt.backoff.reset(key);
    rt.failures.delete(key);
    this.#clearTimer(rt.retryTimers, key);
    if (typeof outcome === 'object') {
      const ms = Math.max(0, Number.isFinite(outcome.requeueAfterMs) ? outcome.requeueAfterMs : 0);
      this.#setTimer(rt.requeueTimers, rt, key, ms);
    }
    log.info(action.summary);
  }

  /** Skips a key that failed in this generation and is still waiting out its backoff, or is terminal. */
  #blocked(rt: Runtime, key: string, generation: number, now: number): boolean {
    const f = rt.failures.get(key);
    if (f === undefined || f.generation !== generation) return false;
    return f.terminal || (f.retryAt !== null && now < f.retryAt);
  }

  /** A key no longer planned has converged or gone: its failure and backoff no longer apply. */
  #forgetUnplanned(rt: Runtime, planned: Set<string>): void {
    for (const key of [...rt.failures.keys()]) {
      if (planned.has(key)) continue;
      rt.failures.delete(key);
      rt.backoff.reset(key);
      this.#clearTimer(rt.retryTimers, key);
    }
  }

  #passSucceeded(rt: Runtime): void {
    rt.passFailure = null;
    rt.backoff.reset(PASS_KEY);
    if (rt.passRetryTimer !== null) this.#clock.clearTimeout(rt.passRetryTimer);
    rt.passRetryTimer = null;
  }

  /** desired/observe/plan threw: retry the whole pass with backoff (not for a TerminalError). */
  #passFailed(rt: Runtime, err: unknown, generation: number): void {
    rt.counters.errors++;
    const terminal = err instanceof TerminalError;
    const { attempts, delayMs } = rt.backoff.failure(PASS_KEY);
    const retryAt = terminal || this.#stopped ? null : this.#clock.now() + delayMs;
    rt.passFailure = { message: errorMessage(err), attempts, terminal, generation, retryAt };
    if (rt.passRetryTimer !== null) this.#clock.clearTimeout(rt.passRetryTimer);
    rt.passRetryTimer = null;
    if (retryAt !== null) {
      rt.passRetryTimer = this.#clock.setTimeout(() => {
        rt.passRetryTimer = null;
        void this.#trigger(rt);
      }, delayMs);
    }
    this.#logger.warn({ loop: rt.loop.name, err, attempts, retryInMs: retryAt === null ? null : delayMs }, 'reconcile pass failed');
  }

  #reportLoop(rt: Runtime, generation: number): void {
    const set = (type: string, status: 'True' | 'False', reason: string, message: string) =>
      rt.status.setLoopCondition({ type, status, reason, message, observedGeneration: generation });
    if (rt.passFailure !== null) {
      const message = `reconcile pass failed: ${rt.passFailure.message}`;
      set('Ready', 'False', 'PassFailed', message);
      set('Degraded', 'True', 'PassFailed', message);
      return;
    }
    const failing = [...rt.failures.entries()].sort(([a], [b]) => (a < b ? -1 : 1));
    if (failing.length === 0) {
      set('Ready', 'True', 'Converged', 'observed state matches desired state');
      set('Degraded', 'False', 'AsExpected', 'no action is failing');
      return;
    }
    const listed = failing.slice(0, 5).map(([k, f]) => `${k}: ${f.message}`);
    const more = failing.length > 5 ? `; and ${failing.length - 5} more` : '';
    const message = `${failing.length} failing: ${listed.join('; ')}${more}`;
    const reason = failing.every(([, f]) => f.terminal) ? 'ActionsFailedTerminally' : 'ActionsFailing';
    set('Ready', 'False', reason, message);
    set('Degraded', 'True', reason, message);
  }

  // ── status ────────────────────────────────────────────────────────────────────────────

  #statusChanged(rt: Runtime): void {
    rt.statusDirty = true;
    if (rt.inPass || rt.flushScheduled) return;
    rt.flushScheduled = true;
    queueMicrotask(() => {
      rt.flushScheduled = false;
      if (!rt.inPass) this.#flushStatus(rt);
    });
  }

  #flushStatus(rt: Runtime): void {
    if (!rt.statusDirty) return;
    rt.statusDirty = false;
    const status = rt.status.snapshot(this.#failureInfo(rt));
    for (const listener of this.#listeners) {
      try {
        listener(rt.loop.name, status);
      } catch (err) {
        this.#logger.error({ err, loop: rt.loop.name }, 'status listener threw');
      }
    }
    for (const dep of rt.dependents) void this.#trigger(dep);
  }

  #failureInfo(rt: Runtime): Record<string, FailureInfo> {
    const out: Record<string, FailureInfo> = {};
    const entries: [string, Failure][] = [...rt.failures.entries()];
    if (rt.passFailure !== null) entries.push([PASS_KEY, rt.passFailure]);
    for (const [key, f] of entries) {
      const info: FailureInfo = { message: f.message, attempts: f.attempts, terminal: f.terminal };
      if (f.retryAt !== null) info.retryAt = new Date(f.retryAt).toISOString();
      out[key] = info;
    }
    return out;
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

function badOption(message: string): never {
  throw new ProxyError('DP_ERR_BAD_OPTION', message);
}

function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function assertUniqueKeys(loop: string, actions: readonly Action<unknown>[]): void {
  const seen = new Set<string>();
  for (const a of actions) {
    if (seen.has(a.key)) throw new Error(`loop ${loop} planned two actions with key ${a.key}`);
    seen.add(a.key);
  }
}

/** Loops ordered so that each comes after the loops it depends on; throws on a cycle. */
function topoOrder(all: Runtime[], byName: Map<string, Runtime>): Runtime[] {
  const out: Runtime[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = (rt: Runtime, path: string[]): void => {
    const s = state.get(rt.loop.name);
    if (s === 'done') return;
    if (s === 'visiting') badOption(`loops depend on each other: ${[...path, rt.loop.name].join(' → ')}`);
    state.set(rt.loop.name, 'visiting');
    for (const dep of rt.loop.dependsOn ?? []) {
      const d = byName.get(dep);
      if (d !== undefined) visit(d, [...path, rt.loop.name]);
    }
    state.set(rt.loop.name, 'done');
    out.push(rt);
  };
  for (const rt of all) visit(rt, []);
  return out;
}
