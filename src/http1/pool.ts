// A keep-alive pool of HTTP/1.1 connections to one upstream, opened by a `connect()` that returns
// any Duplex. Requests wait in a queue when every connection is busy and the limit is reached;
// idle connections are reused most recent first and closed after keepAliveTimeoutMs.
//
// Timeouts run on one coarse ticker per pool (no timer per request): every connection stamps the
// tick of its last I/O, and the ticker fails a request whose replica was silent too long
// (headersTimeoutMs before the head, bodyTimeoutMs inside the body; not while the handler has
// reading paused). Expiry is therefore late by up to one tick (a quarter of the shortest timeout,
// 10 ms – 1 s).
//
// Retries: a request goes out once more, on another connection, only when a reused keep-alive
// connection closed before a single byte of the response arrived (the replica closed it while
// idle, racing our write) and the request is idempotent with a re-sendable body (none, a Buffer or
// a string). Everything else fails to the handler: a streamed body cannot be replayed, and a
// connection that answered anything was alive. A failed connect() fails the request waiting the
// longest (retrying other replicas is connect()'s job).

import type { Duplex } from 'node:stream';
import { systemClock, type Clock, type TimerHandle } from '../clock.js';
import { Exchange, Http1Connection, type ConnectionOwner } from './connection.js';
import { DEFAULT_MAX_HEADER_SIZE } from './parser.js';
import { Http1Error, type Http1Exchange, type Http1Handler, type Http1Request } from './types.js';

export interface Http1PoolOptions {
  /** A new stream to the upstream; rejects when none can be opened (the request gets that error). */
  connect: () => Promise<Duplex>;
  /** Connections at most; more requests queue. Default 256. */
  maxConnections?: number;
  /** Idle connections are closed after this. Default 4 s (below Node's 5 s server keep-alive). */
  keepAliveTimeoutMs?: number;
  /** From the request written to the response head. Default 300 s. */
  headersTimeoutMs?: number;
  /** Longest silence inside a response body. Default 300 s. */
  bodyTimeoutMs?: number;
  /** Status line plus headers, and trailers, at most. Default 64 KiB. */
  maxHeaderSize?: number;
  /** Host header for requests that carry none. Default `localhost`. */
  host?: string;
  /** The ticker's timer. Default: the system clock. */
  clock?: Clock;
}

export const DEFAULT_MAX_CONNECTIONS = 256;
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 4_000; // 4 s
export const DEFAULT_HTTP1_TIMEOUT_MS = 300_000; // 300 s

export class Http1Pool implements ConnectionOwner {
  tick = 0;
  readonly host: string;
  readonly #connect: () => Promise<Duplex>;
  readonly #max: number;
  readonly #keepAliveMs: number;
  readonly #headersMs: number;
  readonly #bodyMs: number;
  readonly #maxHeaderSize: number;
  readonly #tickMs: number;
  readonly #clock: Clock;
  readonly #all = new Set<Http1Connection>();
  /** Idle connections, most recently used last. */
  readonly #idle: Http1Connection[] = [];
  #queue: Exchange[] = [];
  #opening = 0;
  #timer: TimerHandle | null = null;
  #closing = false;
  #destroyed = false;
  #onDrained: (() => void) | null = null;

  constructor(o: Http1PoolOptions) {
    if (typeof o?.connect !== 'function') throw new TypeError('Http1Pool needs a connect function');
    this.#connect = o.connect;
    this.#max = positive('maxConnections', o.maxConnections ?? DEFAULT_MAX_CONNECTIONS);
    this.#keepAliveMs = positive('keepAliveTimeoutMs', o.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS);
    this.#headersMs = positive('headersTimeoutMs', o.headersTimeoutMs ?? DEFAULT_HTTP1_TIMEOUT_MS);
    this.#bodyMs = positive('bodyTimeoutMs', o.bodyTimeoutMs ?? DEFAULT_HTTP1_TIMEOUT_MS);
    this.#maxHeaderSize = positive('maxHeaderSize', o.maxHeaderSize ?? DEFAULT_MAX_HEADER_SIZE);
    this.host = o.host ?? 'localhost';
    this.#clock = o.clock ?? systemClock;
    this.#tickMs = Math.min(1_000, Math.max(10, Math.floor(Math.min(this.#keepAliveMs, this.#headersMs, this.#bodyMs) / 4)));
  }

  /** Open connections (busy or idle). */
  get connections(): number {
    return this.#all.size;
  }

  /** Send a request; the handler hears the response. Never throws: failures go to onResponseError. */
  dispatch(req: Http1Request, handler: Http1Handler): Http1Exchange {
    const ex = new Exchange(req, handler);
    if (this.#destroyed || this.#closing) {
      process.nextTick(() => ex.fail(new Http1Error('DP_HTTP1_POOL_CLOSED', 'the pool is closed')));
      return ex;
    }
    this.#enqueue(ex);
    return ex;
  }

  /** Serve what is queued, then close every connection. */
  close(): Promise<void> {
    this.#closing = true;
    for (const c of this.#idle.splice(0)) c.kill();
    if (this.#drained()) return Promise.resolve();
    return new Promise((resolve) => {
      const prev = this.#onDrained;
      this.#onDrained = () => {
        prev?.();
        resolve();
      };
    });
  }

  /** Fail everything in flight or queued and close every connection now. */
  async destroy(): Promise<void> {
    this.#closing = true;
    this.#destroyed = true;
    const err = new Http1Error('DP_HTTP1_POOL_CLOSED', 'the pool was destroyed');
    for (const ex of this.#queue.splice(0)) ex.fail(err);
    for (const c of [...this.#all]) {
      const ex = c.ex;
      c.kill();
      ex?.fail(err);
    }
    this.#idle.length = 0;
    await this.close();
  }

  // ConnectionOwner
  release(conn: Http1Connection): void {
    if (conn.dead) return;
    conn.stamp = this.tick;
    for (;;) {
      const ex = this.#queue.shift();
      if (ex === undefined) break;
      if (ex.finished) continue; // aborted while waiting
      conn.run(ex);
      return;
    }
    if (this.#closing) {
      conn.kill();
      return;
    }
    this.#idle.push(conn);
  }

  closed(conn: Http1Connection, ex: Exchange | null, err: Error): void {
    this.#all.delete(conn);
    const i = this.#idle.indexOf(conn);
    if (i !== -1) this.#idle.splice(i, 1);
    if (ex !== null) {
      if (!conn.parser.received && conn.served > 0 && ex.replayable && !this.#destroyed) {
        ex.retried = true;
        this.#enqueue(ex);
      } else ex.fail(err);
    }
    this.#maybeOpen();
    if (this.#all.size === 0) this.#stopTicker();
    this.#checkDrained();
  }

  #enqueue(ex: Exchange): void {
    const conn = this.#idle.pop();
    if (conn !== undefined) return conn.run(ex);
    this.#queue.push(ex);
    this.#maybeOpen();
  }

  #maybeOpen(): void {
    if (this.#destroyed) return;
    while (this.#queue.length > this.#opening && this.#all.size + this.#opening < this.#max) this.#open();
  }

  #open(): void {
    this.#opening++;
    let p: Promise<Duplex>;
    try {
      p = this.#connect();
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (socket) => {
        this.#opening--;
        if (this.#destroyed) {
          socket.destroy();
          this.#checkDrained();
          return;
        }
        const conn = new Http1Connection(this, socket, this.#maxHeaderSize);
        this.#all.add(conn);
        this.#startTicker();
        this.release(conn);
      },
      (err: unknown) => {
        this.#opening--;
        const e = err instanceof Error ? err : new Error(String(err));
        for (;;) {
          const ex = this.#queue.shift();
          if (ex === undefined) break;
          if (ex.finished) continue;
          ex.fail(e);
          break;
        }
        this.#maybeOpen();
        this.#checkDrained();
      },
    );
  }

  #startTicker(): void {
    if (this.#timer === null) this.#armTicker();
  }

  /** The next tick; a tick that stopped the ticker (its last connection gone) arms no other. */
  #armTicker(): void {
    const handle = this.#clock.setTimeout(() => {
      this.#onTick();
      if (this.#timer === handle) this.#armTicker();
    }, this.#tickMs);
    this.#timer = handle;
  }

  #stopTicker(): void {
    if (this.#timer === null) return;
    this.#clock.clearTimeout(this.#timer);
    this.#timer = null;
  }

  #onTick(): void {
    const tick = ++this.tick;
    const ms = this.#tickMs;
    for (const conn of this.#all) {
      // Whole ticks since the stamp, less the partial one it fell in: never early, late by < 1 tick.
      const silentMs = (tick - conn.stamp - 1) * ms;
      if (conn.ex === null) {
        if (silentMs >= this.#keepAliveMs) conn.kill();
      } else if (conn.paused) {
        conn.stamp = tick; // the handler is behind, not the replica
      } else if (conn.parser.inBody) {
        if (silentMs >= this.#bodyMs)
          conn.timeout(new Http1Error('DP_HTTP1_BODY_TIMEOUT', `the replica sent nothing for ${this.#bodyMs} ms inside a response body`));
      } else if (silentMs >= this.#headersMs) {
        conn.timeout(new Http1Error('DP_HTTP1_HEADERS_TIMEOUT', `no response headers from the replica within ${this.#headersMs} ms`));
      }
    }
  }

  #drained(): boolean {
    return this.#all.size === 0 && this.#opening === 0 && this.#queue.length === 0;
  }

  #checkDrained(): void {
    if (!this.#closing || !this.#drained()) return;
    this.#stopTicker();
    const done = this.#onDrained;
    this.#onDrained = null;
    done?.();
  }
}

function positive(name: string, v: number): number {
  if (!Number.isFinite(v) || v <= 0) throw new TypeError(`Http1Pool: ${name} must be > 0, got ${v}`);
  return v;
}
