// An in-memory loop for controller tests: the "world" is a Map of key → value.

import { emptyState, type ProxyState, type Service } from '../../src/spec/types.js';
import type { Action, AnyLoop, ApplyResult, BatchOutcome, LoopContext, StatusSnapshot } from '../../src/reconcilers/types.js';

export interface Spec {
  state: ProxyState;
  generation: number;
}

/** A spec with one service per run name (its `clientMaxBodySize` is the value). */
export function specWith(generation: number, runs: Record<string, number>): Spec {
  const state = emptyState();
  state.spec.projects = [{ name: 'main' }];
  state.spec.services = Object.entries(runs).map(([run, size]): Service => ({
    project: 'main',
    run,
    https: false,
    auth: false,
    clientMaxBodySize: size,
    stripPrefix: true,
    rateLimits: [],
    replicas: [],
  }));
  state.metadata = { generation };
  return { state, generation };
}

export interface FakeLoopOptions {
  name: string;
  dependsOn?: string[];
  triggeredBy?: string[];
  watches?: string[];
  settlesAfter?: 'actions' | 'plan';
  concurrency?: number;
  /** Desired world; default: run → String(clientMaxBodySize) for each service. */
  want?: (spec: ProxyState, statuses: StatusSnapshot) => Map<string, string>;
  /** Throw this from apply for `key` on its n-th attempt (1-based), or nothing to succeed. */
  fail?: (key: string, attempt: number) => Error | undefined;
  /** Awaited inside apply before it does anything (to hold an action in flight). */
  gate?: (key: string) => Promise<void> | undefined;
  requeue?: (key: string) => number | undefined;
  /** Use applyBatch instead of apply. */
  batch?: boolean;
  /** Throw from observe while this returns an error. */
  observeError?: () => Error | undefined;
  /** Awaited inside observe. */
  observeGate?: () => Promise<void> | undefined;
}

export interface FakeLoop {
  loop: AnyLoop;
  world: Map<string, string>;
  /** Keys in the order apply was called. */
  applied: string[];
  batches: string[][];
  attempts: Map<string, number>;
  observes: number;
  maxConcurrentObserves: number;
  ctx?: LoopContext;
}

export function fakeLoop(opts: FakeLoopOptions): FakeLoop {
  const want = opts.want ?? ((spec) => new Map(spec.spec.services.map((s) => [s.run, String(s.clientMaxBodySize)])));
  let observing = 0;
  const f: FakeLoop = {
    loop: undefined as unknown as AnyLoop,
    world: new Map(),
    applied: [],
    batches: [],
    attempts: new Map(),
    observes: 0,
    maxConcurrentObserves: 0,
  };

  const applyOne = async (action: Action<string | null>, ctx: LoopContext): Promise<ApplyResult> => {
    f.applied.push(action.key);
    const attempt = (f.attempts.get(action.key) ?? 0) + 1;
    f.attempts.set(action.key, attempt);
    await opts.gate?.(action.key);
    const err = opts.fail?.(action.key, attempt);
    if (err !== undefined) {
      ctx.status.set(action.key, { type: 'Ready', status: 'False', reason: 'ApplyFailed', message: err.message });
      throw err;
    }
    if (action.payload === null) {
      f.world.delete(action.key);
      ctx.status.delete(action.key);
    } else {
      f.world.set(action.key, action.payload);
      ctx.status.set(action.key, { type: 'Ready', status: 'True', reason: 'Applied', message: `value ${action.payload}` });
    }
    const ms = opts.requeue?.(action.key);
    return ms === undefined ? 'done' : { requeueAfterMs: ms };
  };

  const loop = {
    name: opts.name,
    dependsOn: opts.dependsOn,
    ...(opts.triggeredBy ? { triggeredBy: opts.triggeredBy } : {}),
    ...(opts.watches ? { watches: opts.watches } : {}),
    ...(opts.settlesAfter ? { settlesAfter: opts.settlesAfter } : {}),
    ...(opts.concurrency ? { concurrency: opts.concurrency } : {}),
    desired: (spec: ProxyState, statuses: StatusSnapshot) => want(spec, statuses),
    async observe(ctx: LoopContext): Promise<Map<string, string>> {
      f.ctx = ctx;
      f.observes++;
      observing++;
      f.maxConcurrentObserves = Math.max(f.maxConcurrentObserves, observing);
      try {
        await opts.observeGate?.();
        const err = opts.observeError?.();
        if (err !== undefined) throw err;
        return new Map(f.world);
      } finally {
        observing--;
      }
    },
    plan(desired: Map<string, string>, observed: Map<string, string>): Action<string | null>[] {
      const out: Action<string | null>[] = [];
      for (const [key, value] of desired) {
        const cur = observed.get(key);
        if (cur === value) continue;
        out.push({ key, kind: cur === undefined ? 'create' : 'update', summary: `set ${key}`, payload: value });
      }
      for (const key of observed.keys()) {
        if (!desired.has(key)) out.push({ key, kind: 'delete', summary: `delete ${key}`, payload: null });
      }
      return out;
    },
  };
  if (opts.batch) {
    f.loop = {
      ...loop,
      async applyBatch(actions: Action<string | null>[], ctx: LoopContext): Promise<Map<string, BatchOutcome>> {
        f.batches.push(actions.map((a) => a.key));
        const out = new Map<string, BatchOutcome>();
        for (const a of actions) {
          try {
            out.set(a.key, await applyOne(a, ctx));
          } catch (error) {
            out.set(a.key, { error });
          }
        }
        return out;
      },
    };
  } else {
    f.loop = { ...loop, apply: applyOne };
  }
  return f;
}

/** Polls `check` until it holds or the deadline passes (no fixed sleeps). */
export async function until(check: () => boolean, deadlineMs = 5_000): Promise<void> {
  const end = Date.now() + deadlineMs;
  while (!check()) {
    if (Date.now() > end) throw new Error('condition not met before the deadline');
    await new Promise((r) => setImmediate(r));
  }
}

export function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
