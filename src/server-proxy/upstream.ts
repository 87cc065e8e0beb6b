// Connections to replicas: `connect(serviceKey)` (the SSH loop's balancer: a Ready replica by
// least connections, another one when opening fails) wrapped with a connect timeout, and one
// HTTP/1.1 keep-alive pool (src/http1) per service whose connector is that function, so
// connections over tunnels are reused across requests. Errors are mapped to the proxy's statuses here.

import { Socket as NetSocket } from 'node:net';
import type { Duplex } from 'node:stream';
import { Http1Pool, type ConnectFn } from '../http1/index.js';

export type { ConnectFn };

export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000; // 10 s
export const DEFAULT_READ_TIMEOUT_MS = 300_000; // 300 s
export const DEFAULT_CONNECTIONS_PER_SERVICE = 256;

/** The connect timeout passed before a stream was open. */
export class UpstreamConnectTimeoutError extends Error {
  readonly code = 'DP_UPSTREAM_CONNECT_TIMEOUT';
  constructor(service: string, ms: number) {
    super(`opening a connection to ${service} took longer than ${ms} ms`);
    this.name = 'UpstreamConnectTimeoutError';
  }
}

/** `connect` with a deadline; a stream that opens after it is destroyed. */
export function connectWithTimeout(connect: ConnectFn, serviceKey: string, ms: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new UpstreamConnectTimeoutError(serviceKey, ms));
    }, ms);
    // A connect that throws at once fails like one that rejects: through the same path, timer cleared.
    new Promise<Duplex>((opened) => opened(connect(serviceKey))).then(
      (stream) => {
        clearTimeout(timer);
        if (done) stream.destroy();
        else resolve(stream);
      },
      (err: unknown) => {
        clearTimeout(timer);
        if (!done) reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}

export interface UpstreamError {
  status: 502 | 503 | 504;
  detail: string;
}

/** What the client is told when no response headers came from the replica. */
export function upstreamError(err: unknown, serviceKey: string): UpstreamError {
  const e = err as { code?: string; status?: number; name?: string; message?: string };
  if (e?.code === 'DP_UPSTREAM_CONNECT_TIMEOUT' || e?.code === 'DP_HTTP1_HEADERS_TIMEOUT') {
    return { status: 504, detail: 'Timed out requesting upstream' };
  }
  if (e?.status === 503 || e?.name === 'NoReadyReplicaError') {
    return { status: 503, detail: `Service ${serviceKey} has no ready replica` };
  }
  return { status: 502, detail: 'Error requesting upstream' };
}

export interface UpstreamPoolsOptions {
  connect: ConnectFn;
  connectTimeoutMs: number;
  /** Waiting for response headers, and silence inside a body. Default 300 s. */
  readTimeoutMs?: number;
  connectionsPerService?: number;
  /** Idle keep-alive connections are closed after this. Default 4 s (below Node's 5 s server keep-alive). */
  keepAliveTimeoutMs?: number;
}

/** One HTTP/1.1 pool per service key, created on first use, closed when the service leaves. */
export class UpstreamPools {
  readonly #o: UpstreamPoolsOptions;
  readonly #pools = new Map<string, Http1Pool>();
  #seq = 0;

  constructor(o: UpstreamPoolsOptions) {
    this.#o = o;
  }

  get size(): number {
    return this.#pools.size;
  }

  get(serviceKey: string): Http1Pool {
    let pool = this.#pools.get(serviceKey);
    if (pool) return pool;
    const { connect, connectTimeoutMs } = this.#o;
    const readTimeoutMs = this.#o.readTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS;
    pool = new Http1Pool({
      // Only for a client that sent no Host (HTTP/1.0): the Host header is otherwise always the client's.
      host: `svc-${++this.#seq}.server-proxy.internal`,
      maxConnections: this.#o.connectionsPerService ?? DEFAULT_CONNECTIONS_PER_SERVICE,
      keepAliveTimeoutMs: this.#o.keepAliveTimeoutMs ?? 4_000,
      headersTimeoutMs: readTimeoutMs,
      bodyTimeoutMs: readTimeoutMs,
      connect: () =>
        connectWithTimeout(connect, serviceKey, connectTimeoutMs).then((stream) => {
          // Requests are small writes answered by the replica: no Nagle delay on TCP replicas.
          if (stream instanceof NetSocket) stream.setNoDelay(true);
          return stream;
        }),
    });
    this.#pools.set(serviceKey, pool);
    return pool;
  }

  /** Close the pools of services not in `keep` (their in-flight requests finish first). */
  retain(keep: ReadonlySet<string>): void {
    for (const [key, pool] of this.#pools) {
      if (keep.has(key)) continue;
      this.#pools.delete(key);
      void pool.close().catch(() => undefined);
    }
  }

  async close(): Promise<void> {
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.all(pools.map((p) => p.destroy().catch(() => undefined)));
  }
}
