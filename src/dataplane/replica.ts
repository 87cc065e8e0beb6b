// One replica on the books of Replicas: how it is reached, its requests in flight, its pool,
// and what removal and the drain period do to it.

import type { Duplex } from 'node:stream';
import type { Http1Pool } from '../http1/index.js';
import { DataPlaneError, noReadyReplica } from './errors.js';
import type { Replicas } from './replicas.js';

/** How a replica is reached: an SSH tunnel, or a plain TCP address. */
export interface Upstream {
  isReady(): boolean;
  /** A new byte stream to the replica's app port. */
  open(): Promise<Duplex>;
}

/** The request count of one service's replica id, shared by its replacements while any is on the books. */
export interface Tally {
  total: number;
  /** Replicas of the id on the books (in rotation or draining). */
  refs: number;
}

/** Opening a connection to a replica failed: nothing was sent, another replica may be tried. */
export class ConnectFailure extends Error {
  readonly code = 'DP_UPSTREAM_CONNECT';
  constructor(
    readonly timedOut: boolean,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'ConnectFailure';
  }
}

/** Choices made so far, in this process: a replica's `chosen` orders it among equals. */
let choices = 0;

export class Replica {
  inFlight = 0;
  requests = 0;
  /** When it was last chosen (`choices` then); 0: never, so a new replica goes first. */
  chosen = 0;
  removed = false;
  /** Left the books (forget()): its tally no longer counts it. */
  forgotten = false;
  /** Cut (drain period over, or close()): a stream opened to it now is closed at once. */
  destroyed = false;
  #pool: Http1Pool | null = null;
  /** Pools replaced by renewPool() still finishing answers: cut with the replica. */
  #oldPools: Set<Http1Pool> | null = null;
  readonly pinned = new Set<Duplex>();
  /** Requests sent to it through the choice, until they end (see moveUnsent()). */
  readonly dispatched = new Set<{ moveOff(r: Replica): void }>();
  onIdle: (() => void) | null = null;
  /** What drain() returns while one runs: a second call waits for the same end. */
  drained: Promise<void> | null = null;

  constructor(
    readonly serviceKey: string,
    readonly id: string,
    readonly upstream: Upstream,
    private readonly owner: Replicas,
    readonly tally: Tally,
  ) {
    tally.refs++;
  }

  /** One more request (or pinned stream) sent to it. */
  count(): void {
    this.chosen = ++choices;
    this.inFlight++;
    this.requests++;
    this.tally.total++;
  }

  get pool(): Http1Pool {
    return (this.#pool ??= this.owner.newPool(this));
  }

  /** The next request gets a new pool (new timeouts); the old one closes once its answers ended. */
  renewPool(): void {
    const old = this.#pool;
    if (old === null) return;
    this.#pool = null;
    const olds = (this.#oldPools ??= new Set());
    olds.add(old);
    void old
      .close()
      .catch(() => undefined)
      .finally(() => olds.delete(old));
  }

  done(): void {
    this.inFlight--;
    if (!this.removed || this.inFlight > 0) return;
    if (this.onIdle !== null) this.onIdle();
    else this.owner.forget(this);
  }

  /** Out of rotation: idle connections close now, busy ones after their answer. */
  retire(): void {
    this.removed = true;
    void this.#pool?.close().catch(() => undefined);
  }

  /**
   * Out of rotation (the list no longer has it): requests still queued in its pool, not a byte of
   * them written, go through the choice again instead of waiting for this replica.
   */
  moveUnsent(): void {
    for (const d of [...this.dispatched]) d.moveOff(this);
  }

  destroy(): void {
    this.removed = true;
    this.destroyed = true;
    void this.#pool?.destroy().catch(() => undefined);
    for (const p of this.#oldPools ?? []) void p.destroy().catch(() => undefined);
    for (const s of this.pinned) s.destroy();
  }
}

/** With nothing left to try: no replica was Ready, or the last one tried failed this way. */
export function finalError(serviceKey: string, last: unknown): Error {
  if (last === null) return noReadyReplica(serviceKey);
  if (last instanceof ConnectFailure && last.timedOut) return new DataPlaneError('DP_ERR_UPSTREAM_TIMEOUT', last.message, { cause: last });
  return new DataPlaneError('DP_ERR_UPSTREAM_FAILED', `every Ready replica of ${serviceKey} failed: ${errorText(last)}`, { cause: last });
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
