// The contract between the shared controller and each reconcile loop.

import type { Logger } from 'pino';
import type { ProxyState } from '../spec/types.js';
import type { Clock } from '../clock.js';
import type { Condition, ConditionInput } from './conditions.js';

/** What an action does; the usual three plus whatever a loop needs (`renew`, `reload`, …). */
export type ActionKind = 'create' | 'update' | 'delete' | (string & {});

/** One step from observed towards desired. `key` is stable across passes (a file, a replica id). */
export interface Action<A> {
  key: string;
  kind: ActionKind;
  /** One human sentence for plans and logs; never a secret. */
  summary: string;
  payload: A;
  /** Optional unified diff for dry-run output (Nginx files). */
  diff?: string;
}

/**
 * What happens next for one key: `'done'`, or come back after a delay. A thrown error means
 * "retry with backoff"; a thrown TerminalError means "not again until the next generation".
 */
export type ApplyResult = 'done' | { requeueAfterMs: number };

/** Per-key outcome of a batch: a result, or the error that key failed with. */
export type BatchOutcome = ApplyResult | { error: unknown };

/** Per-object conditions a loop reports. Writes that change nothing are dropped. */
export interface StatusWriter {
  /** Sets one condition of `objectKey`; observedGeneration defaults to the pass's generation. */
  set(objectKey: string, condition: Omit<ConditionInput, 'observedGeneration'> & { observedGeneration?: number }): void;
  /** Removes an object and all its conditions. */
  delete(objectKey: string): void;
  /** Removes every object whose key is not in `keep`. */
  prune(keep: Iterable<string>): void;
  get(objectKey: string): readonly Condition[] | undefined;
  /**
   * Publishes the typed facts other loops, the CLI and metrics read about `objectKey`
   * (replacing what was there; `undefined` removes them). Equal outputs change nothing.
   */
  setOutputs(objectKey: string, outputs: Outputs | undefined): void;
  outputs(objectKey: string): Outputs | undefined;
  keys(): string[];
}

/** One published fact: machines read these, people read condition messages. */
export type OutputValue = string | number | boolean | null;

/** What a loop publishes about one object (outputs.ts names each loop's shape). */
export type Outputs = Readonly<Record<string, OutputValue>>;

/** One object's status: conditions for people and for Ready/Degraded, outputs for other code. */
export interface ObjectStatus {
  conditions: Condition[];
  outputs?: Outputs;
}

/** What a loop's background work gets at start: the live status writer and a way to ask for a pass. */
export interface LoopHandle {
  /**
   * The loop's status, outside any pass (a tunnel that drops reports through this). Writes go
   * out as soon as the writer yields and trigger the loops that read this one's status; during
   * a pass they are held back with the pass's own.
   */
  status: StatusWriter;
  /** Asks the controller for one more pass of this loop. */
  trigger(): void;
}

/** One sample of a metric family: label values and the value. */
export type MetricSample = readonly [labels: Readonly<Record<string, string>>, value: number];

/** A Prometheus metric family a loop exposes; `read` runs at every scrape. */
export interface MetricFamily {
  /** Without the process-wide prefix (`dstack_proxy_`). */
  name: string;
  help: string;
  type: 'counter' | 'gauge';
  labelNames: readonly string[];
  read(): readonly MetricSample[] | Promise<readonly MetricSample[]>;
}

/**
 * Handed to observe/apply: what the loop may touch besides its own slice of the world. Valid
 * for that call only: background work reports through the LoopHandle from start().
 */
export interface LoopContext {
  /** The generation of the spec this pass works from. */
  generation: number;
  /** Status writes of a pass go out together, once the pass has settled. */
  status: StatusWriter;
  clock: Clock;
  logger: Logger;
}

export interface Loop<D, O, A> {
  name: string;
  /**
   * Called once before the first pass, in dependency order: acquire what outlives passes
   * (listening sockets, a background watcher) and keep `handle` for reporting between passes.
   */
  start?(handle: LoopHandle): void | Promise<void>;
  /**
   * Called once when the controller stops, after in-flight actions finished, in reverse
   * dependency order: release everything (tunnels, sockets, processes). Must not throw twice.
   */
  close?(): Promise<void>;
  /** The loop's metric families; called once when the daemon is assembled. */
  metrics?(): readonly MetricFamily[];
  /**
   * Facts about the loop's status objects that change too often for the status writer (a
   * write per request): read at each GET /api/v1/status and added, by object key, to that
   * object's status. Keys without an object are left out.
   */
  liveStatus?(): Readonly<Record<string, Readonly<Record<string, unknown>>>>;
  /**
   * Loops whose status this loop reads in `desired`; their status changes trigger this loop,
   * and a pass of this loop starts only once each of them has settled a pass that read the
   * generation current when this pass was asked for (or has nothing to do). It never waits
   * for their later passes: a dependency that requeues all the time does not starve it.
   */
  dependsOn?: readonly string[];
  /**
   * The loops of `dependsOn` whose status changes trigger this loop; default: all of them. A
   * dependency left out is still waited for, but only ordered before this loop: its status
   * is not read, so a pass on each of its changes could never change anything (Nginx needs
   * the balancer sockets to exist, and never reads the SSH loop's status).
   */
  triggeredBy?: readonly string[];
  /**
   * Loops whose status this loop reads but never waits for: their status changes trigger this
   * loop (the SSH loop closes a removed service's socket once Nginx no longer routes to it).
   * May point back at a loop that depends on this one.
   */
  watches?: readonly string[];
  /**
   * When a pass of this loop has settled, so that dependents may run on its status:
   * `'actions'` (default) once its actions are applied (Nginx needs the balancer sockets to
   * exist); `'plan'` once it has observed and planned (the TLS loop: what a dependent reads is
   * what exists; certificates it obtains later arrive as status changes that trigger the
   * dependents again, so a slow DNS check or certbot run never holds them back).
   */
  settlesAfter?: 'actions' | 'plan';
  /** Actions of this loop applied at once; default the controller's concurrency. */
  concurrency?: number;
  /** Called once after the actions of every pass that planned some (batched writes). */
  afterActions?(ctx: LoopContext): Promise<void>;
  /** Pure. */
  desired(spec: ProxyState, statuses: StatusSnapshot): D;
  observe(ctx: LoopContext): Promise<O>;
  /** Pure. Keys must be unique within one plan. */
  plan(desired: D, observed: O): Action<A>[];
  /** Applies one action. A loop defines this, or applyBatch, or both (then applyBatch wins). */
  apply?(action: Action<A>, ctx: LoopContext): Promise<ApplyResult>;
  /**
   * Applies every eligible action of a pass at once (Nginx: one reload per batch). Returns an
   * outcome per key; a key with no outcome counts as failed. Throwing fails every key.
   */
  applyBatch?(actions: Action<A>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>>;
  /**
   * Keys that were failing and are no longer planned (converged, or left the spec): the loop
   * may clear what it reported about them.
   */
  released?(keys: string[], ctx: LoopContext): Promise<void>;
}

/** A loop of any types, as the controller holds it. */
export type AnyLoop = Loop<unknown, unknown, unknown>;

/**
 * Checks a loop against the contract where it is written (the compiler infers D, O and A from
 * desired/observe/plan), and returns it unchanged: any `Loop<D, O, A>` is an AnyLoop.
 */
export function defineLoop<D, O, A, L extends Loop<D, O, A>>(loop: L & Loop<D, O, A>): L {
  return loop;
}

/** An action key that is failing, as GET /api/v1/status shows it. */
export interface FailureInfo {
  message: string;
  attempts: number;
  /** True for a TerminalError: not retried until the next generation. */
  terminal: boolean;
  /** ISO time of the next retry, absent for terminal failures. */
  retryAt?: string;
}

export interface LoopStatus {
  /** Loop-level conditions: `Ready` and `Degraded`. */
  conditions: Condition[];
  /**
   * Per-object conditions and outputs reported through the status writer, by object key: a live
   * read-only view in no particular order (see StatusStore.snapshot); copy it to keep it.
   */
  objects: Readonly<Record<string, ObjectStatus>>;
  /** Action keys currently failing, by action key. */
  failures: Record<string, FailureInfo>;
}

export interface StatusSnapshot {
  /** The generation of the spec as the controller last read it. */
  generation: number;
  /**
   * The newest generation every loop has observed (settled a pass for); 0 before the first
   * pass. Equal to `generation` once the whole document is acted on. Always set by the
   * controller.
   */
  observedGeneration?: number;
  loops: Record<string, LoopStatus>;
}

/** Per-loop counters, for /metrics. */
export interface LoopCounters {
  passes: number;
  /** Failed passes plus failed actions. */
  errors: number;
  actionsApplied: number;
  lastPassDurationMs: number;
}
