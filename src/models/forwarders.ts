// How a chat request reaches a replica. Injected into the plugin so that both deployments share
// it: the gateway goes through its own Nginx (load balancing, rate limits and stats like any other
// request; Nginx lets 127.0.0.1 past auth_request), the in-server proxy through the SSH loop's
// `connect(serviceKey)`. Both send with the lean HTTP/1.1 client of src/http1, keep connections
// alive, stream the response body, and read a small non-streaming answer whole (upstream.ts).

import { EventEmitter } from 'node:events';
import { connect as netConnect } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { Http1Pool } from '../http1/index.js';
import type { Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { ModelApiError } from './errors.js';
import { exchange } from './upstream.js';

export interface UpstreamRequest {
  /** Path on the replica, e.g. `/v1/chat/completions` or `/generate_stream`. */
  path: string;
  body: Buffer | string;
  /** Aborted when the client goes away: the replica stops generating. */
  signal: ClientAbort;
}

/**
 * Emits 'abort' once when the client goes away. An EventEmitter rather than an AbortController:
 * creating one and listening on its signal cost more CPU per request than the rest of the
 * plugin's own work.
 */
export class ClientAbort extends EventEmitter {
  aborted = false;

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.emit('abort');
  }
}

export interface UpstreamResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /**
   * A Readable that streams as the replica sends (consume or destroy it), or a Buffer when the
   * forwarder read a small answer whole.
   */
  body: Readable | Buffer;
}

export interface Forwarder {
  forward(service: Service, request: UpstreamRequest): Promise<UpstreamResponse>;
  close(): Promise<void>;
}

export interface ForwarderTimeouts {
  /** Time to the response headers: beyond it the client gets 504. Default 300 s (dstack's proxy_read_timeout). */
  headersTimeoutMs?: number;
  /** Longest silence inside a body (between tokens). Default 300 s. */
  bodyTimeoutMs?: number;
}

export const DEFAULT_UPSTREAM_TIMEOUT_MS = 300_000; // 300 s

/** The request head every forwarded chat request carries besides Host. */
const JSON_HEADERS = ['content-type', 'application/json', 'accept', 'application/json, text/event-stream'] as const;

export interface NginxForwarderOptions extends ForwarderTimeouts {
  /** The port Nginx serves the services' plain-HTTP sites on. */
  httpPort: number;
  /** Default 127.0.0.1 (the address Nginx lets past auth_request). */
  host?: string;
  /** Most keep-alive connections to Nginx. Default 256. */
  connections?: number;
}

/** Forwards through the gateway's Nginx with the service's Host header. */
export function nginxForwarder(o: NginxForwarderOptions): Forwarder {
  if (!Number.isInteger(o.httpPort) || o.httpPort < 1 || o.httpPort > 65535) throw new RangeError(`httpPort must be a TCP port, got ${o.httpPort}`);
  const host = o.host ?? '127.0.0.1';
  const pool = new Http1Pool({
    connect: async () => netConnect({ port: o.httpPort, host, noDelay: true }),
    maxConnections: o.connections ?? 256,
    headersTimeoutMs: o.headersTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
    bodyTimeoutMs: o.bodyTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
  });
  return {
    async forward(service, req) {
      if (!service.domain) throw new ModelApiError(503, `Service ${serviceKey(service)} has no domain on this gateway`);
      return exchange(pool, { method: 'POST', path: req.path, headers: ['host', service.domain, ...JSON_HEADERS], body: req.body }, req.signal);
    },
    close: () => pool.close(),
  };
}

/** Opens a byte stream to a Ready replica of the service (the SSH loop's balancer). */
export type ConnectFn = (serviceKey: string) => Duplex | Promise<Duplex>;

export interface ConnectForwarderOptions extends ForwarderTimeouts {
  /** Most keep-alive connections per service. Default 64. */
  connectionsPerService?: number;
}

/**
 * Forwards over streams from `connect(serviceKey)`: one keep-alive Http1Pool per service whose
 * connections are those Duplexes (a lean client: this hop is most of the API's per-request CPU).
 * A `connect` that throws a ModelApiError (say 503, no Ready replica) gives the client that
 * status; any other failure is a 502.
 */
export function connectForwarder(connect: ConnectFn, o: ConnectForwarderOptions = {}): Forwarder {
  const pools = new Map<string, { pool: Http1Pool; headers: readonly string[] }>(); // service key → pool
  const poolFor = (service: Service): { pool: Http1Pool; headers: readonly string[] } => {
    const key = serviceKey(service);
    let p = pools.get(key);
    if (p === undefined) {
      const host = service.domain ?? `svc-${pools.size + 1}.models.internal`;
      const pool = new Http1Pool({
        connect: async () => connect(key),
        host,
        maxConnections: o.connectionsPerService ?? 64,
        headersTimeoutMs: o.headersTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
        bodyTimeoutMs: o.bodyTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
      });
      p = { pool, headers: ['host', host, ...JSON_HEADERS] };
      pools.set(key, p);
    }
    return p;
  };
  return {
    forward(service, req) {
      const { pool, headers } = poolFor(service);
      return exchange(pool, { method: 'POST', path: req.path, headers, body: req.body }, req.signal);
    },
    async close() {
      await Promise.all([...pools.values()].map(({ pool }) => pool.close()));
    },
  };
}
