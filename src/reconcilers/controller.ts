// The shared controller that drives every reconcile loop: it holds one LoopRunner per loop
// (loop-runner.ts: that loop's passes, action queue, failing keys and their timers, status) and
// everything between loops: start and close order, the gate before a pass, which status
// changes trigger which loop, the periodic resync, and the combined status.
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

import pino from 'pino';
import { ProxyError } from '../errors.js';
import type { ProxyState } from '../spec/types.js';
import { backoffPolicy, type BackoffPolicy } from './backoff.js';
import { systemClock, type Clock, type TimerHandle } from '../clock.js';
import { badOption, orderLoops } from './loop-graph.js';
import { LoopRunner, type RunnerHost, type SpecSnapshot } from './loop-runner.js';
import { settledAll } from './settling.js';
import { readOnlyWriter } from './status.js';
import type { Action, AnyLoop, LoopContext, LoopCounters, LoopStatus, StatusSnapshot } from './types.js';

export { PASS_KEY, type SpecSnapshot } from './loop-runner.js';

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

export class Controller {
  readonly #runners: readonly LoopRunner[]; // in dependency order
  /** Per loop: the loops its status changes trigger (dependents that read it, and watchers). */
  readonly #triggers = new Map<LoopRunner, readonly LoopRunner[]>();
  /** Per loop: the loops it waits for before a pass. */
  readonly #dependencies = new Map<LoopRunner, readonly LoopRunner[]>();
  readonly #getSpec: () => SpecSnapshot;
  readonly #clock: Clock;
  readonly #resyncIntervalMs: number;
  readonly #logger: pino.Logger;
  readonly #listeners = new Set<StatusListener>();
  #resyncTimer: TimerHandle | null = null;
  /** Loops' start() calls; passes wait for them. */
  #starting: Promise<void> | null = null;
  #started = false;
  /** Inside #startLoops: triggers wait for the first round. */
  #startingLoops = false;
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

    const host: RunnerHost = {
      getSpec,
      statuses: () => this.statuses(),
      clock,
      logger: this.#logger,
      stopped: () => this.#stopped,
      gate: (rt) => {
        const deps = this.#dependencies.get(rt) ?? [];
        return deps.length === 0 ? Promise.resolve() : settledAll(deps, this.#currentGeneration(), () => this.#stopped);
      },
      publish: (rt) => this.#publish(rt),
    };
    this.#runners = orderLoops(loops).map((loop) => new LoopRunner(loop, host, { concurrency, backoff: policy, random: opts.random }));
    const byName = new Map(this.#runners.map((rt) => [rt.loop.name, rt]));
    const named = (names: readonly string[] | undefined): LoopRunner[] => (names ?? []).flatMap((n) => byName.get(n) ?? []);
    const triggers = new Map<LoopRunner, Set<LoopRunner>>(this.#runners.map((rt) => [rt, new Set()]));
    for (const rt of this.#runners) {
      const triggeredBy = rt.loop.triggeredBy ?? rt.loop.dependsOn ?? [];
      for (const dep of named(rt.loop.dependsOn)) if (triggeredBy.includes(dep.loop.name)) triggers.get(dep)!.add(rt);
      this.#dependencies.set(rt, named(rt.loop.dependsOn));
    }
    for (const rt of this.#runners) for (const w of named(rt.loop.watches)) triggers.get(w)!.add(rt);
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
    this.#startingLoops = true;
    try {
      for (const rt of this.#runners) {
        await rt.loop.start?.({ status: rt.status.store.writer(), trigger: () => this.#trigger(rt) });
      }
    } finally {
      this.#startingLoops = false;
    }
    this.#scheduleResync();
  }

  /**
   * A trigger from a loop's handle or a status change. While the loops are starting there is
   * nothing to do: no pass runs before every loop has started, and the first round, right
   * after, runs every loop anyway.
   */
  #trigger(rt: LoopRunner): void {
    if (!this.#startingLoops) void rt.passes.trigger();
  }

  /** A new generation was stored: run every loop (dependencies first). */
  notify(): void {
    // A failed start was reported to start()'s caller; a trigger after it must not become an
    // unhandled rejection (fatal in Node).
    this.reconcileAll().catch(() => undefined);
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
    return Promise.all(this.#runners.map((rt) => rt.passes.trigger())).then(() => undefined);
  }

  /**
   * Resolves once every loop has settled a pass that read the generation current at this
   * call (a loop with nothing running or pending counts as settled). Unlike reconcileAll it
   * does not wait for actions of loops that settle after planning (certbot runs).
   */
  whenSettled(): Promise<void> {
    const starting = this.#starting ?? Promise.resolve();
    return starting.then(() => settledAll(this.#runners, this.#currentGeneration(), () => this.#stopped));
  }

  /** Resolves once no pass is running or pending (timers may still be set). */
  async whenIdle(): Promise<void> {
    for (;;) {
      await new Promise<void>((r) => setImmediate(r)); // let queued status flushes run
      const busy = this.#runners.flatMap((rt) => rt.passes.inFlight());
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

  /** Every loop's status: conditions and failures copied, objects a live read-only view each. */
  statuses(): StatusSnapshot {
    const loops: Record<string, LoopStatus> = {};
    for (const rt of this.#runners) loops[rt.loop.name] = rt.snapshot();
    const observedGeneration = Math.min(...this.#runners.map((rt) => rt.settling.observedGeneration));
    return {
      generation: this.#getSpec().generation,
      observedGeneration: Number.isFinite(observedGeneration) ? Math.max(0, observedGeneration) : 0,
      loops,
    };
  }

  /** Called with a loop's new status whenever it changed; returns an unsubscribe function. */
  onStatus(listener: StatusListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  counters(): Record<string, LoopCounters> {
    return Object.fromEntries(this.#runners.map((rt) => [rt.loop.name, { ...rt.counters }]));
  }

  /** What each loop would do for `state`, applying nothing and writing no status. */
  async dryRun(state: ProxyState): Promise<Record<string, Action<unknown>[]>> {
    const out: Record<string, Action<unknown>[]> = {};
    const statuses = this.statuses();
    for (const rt of this.#runners) {
      const ctx: LoopContext = { ...rt.context(), status: readOnlyWriter(rt.status.store.writer()) };
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
      for (const rt of this.#runners) void rt.passes.trigger();
      this.#scheduleResync();
    }, this.#resyncIntervalMs);
  }

  async #drain(): Promise<void> {
    this.#stopped = true;
    if (this.#resyncTimer !== null) this.#clock.clearTimeout(this.#resyncTimer);
    this.#resyncTimer = null;
    for (const rt of this.#runners) {
      rt.timers.clearAll();
      rt.passes.stop();
      rt.settling.wake();
    }
    await Promise.all(this.#runners.flatMap((rt) => rt.passes.running ?? []));
    await Promise.all(this.#runners.map((rt) => rt.actions.onIdle()));
    await this.#starting?.catch(() => undefined);
    for (const rt of [...this.#runners].reverse()) {
      try {
        await rt.loop.close?.();
      } catch (err) {
        this.#logger.warn({ err, loop: rt.loop.name }, 'closing a loop failed');
      }
    }
  }

  // ── status ────────────────────────────────────────────────────────────────────────────

  #publish(rt: LoopRunner): void {
    // Nobody may be listening: no copy then.
    const status = this.#listeners.size === 0 ? null : rt.snapshot();
    for (const listener of this.#listeners) {
      try {
        listener(rt.loop.name, status!);
      } catch (err) {
        this.#logger.error({ err, loop: rt.loop.name }, 'status listener threw');
      }
    }
    for (const other of this.#triggers.get(rt) ?? []) this.#trigger(other);
  }

  #currentGeneration(): number {
    try {
      return this.#getSpec().generation;
    } catch {
      return -1; // the pass will fail on it too; wait for nothing
    }
  }
}
