// How a chat request reaches a replica. Injected into the plugin so that both deployments share
// it: the gateway goes through its own Nginx (load balancing, rate limits and stats like any other
// request) on the internal listener — a Unix socket only the gateway can connect to, whose
// servers skip auth_request (the plugin checked the token) and take the client's address from the
// X-Real-IP sent here, so limits keyed by address or header count per client; the in-server
// proxy through the SSH loop's `connect(serviceKey)`. Both send with the lean HTTP/1.1 client of src/http1, keep connections
// alive, stream the response body, and read a small non-streaming answer whole (upstream.ts).

import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { connect as netConnect, isIP } from 'node:net';
import { Http1Pool, type ConnectFn } from '../http1/index.js';
import type { Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { ModelApiError } from './errors.js';
import type { ForwardedClient, Forwarder, ForwarderTimeouts } from './types.js';
import { exchange } from './upstream.js';

export const DEFAULT_UPSTREAM_TIMEOUT_MS = 300_000; // 300 s

/** The request head every forwarded chat request carries besides Host. */
const JSON_HEADERS = ['content-type', 'application/json', 'accept', 'application/json, text/event-stream'] as const;

export interface NginxForwarderOptions extends ForwarderTimeouts {
  /** The internal listener of the gateway's Nginx (a Unix socket). */
  socketPath: string;
  /** Most keep-alive connections to Nginx. Default 256. */
  connections?: number;
}

/** What a client function reads of a request (a FastifyRequest has it). */
export interface ClientRequestLike {
  socket: { remoteAddress?: string | undefined };
  headers: IncomingHttpHeaders;
}

/** The connection's peer as the client: nothing the client sent is trusted for its address. */
export function peerClient(req: ClientRequestLike): ForwardedClient {
  const address = (req.socket.remoteAddress ?? '').replace(/^::ffff:(?=\d+\.)/, '');
  const prior = req.headers['x-forwarded-for'];
  const chain = typeof prior === 'string' && prior !== '' ? `${prior}, ${address}` : address;
  return { address, forwardedFor: chain, proto: 'http', headers: req.headers };
}

/** The header an entrypoint site adds (from a file only its Nginx reads) to vouch for X-Real-IP. */
export const ENTRYPOINT_KEY_HEADER = 'x-dstack-entrypoint-key';

/**
 * The client as an entrypoint site saw it, when the request carries the entrypoint key: Nginx
 * set X-Real-IP to the address it accepted from, and X-Forwarded-For ends with it. Without the
 * key (a client calling the API directly, wherever from), the connection's peer.
 */
export function entrypointClient(key: string): (req: ClientRequestLike) => ForwardedClient {
  const want = createHash('sha256').update(key).digest();
  return (req) => {
    const got = req.headers[ENTRYPOINT_KEY_HEADER];
    const real = req.headers['x-real-ip'];
    if (typeof got !== 'string' || typeof real !== 'string' || isIP(real) === 0) return peerClient(req);
    if (!timingSafeEqual(createHash('sha256').update(got).digest(), want)) return peerClient(req);
    const chain = req.headers['x-forwarded-for'];
    const proto = req.headers['x-forwarded-proto'];
    return {
      address: real,
      forwardedFor: typeof chain === 'string' && chain !== '' ? chain : real,
      proto: proto === 'https' ? 'https' : 'http',
      headers: req.headers,
    };
  };
}

/** Headers the forwarder writes itself: a rate-limit key of that name never copies the client's. */
const OWN_HEADERS = new Set([
  'host',
  'content-type',
  'content-length',
  'transfer-encoding',
  'connection',
  'accept',
  'x-real-ip',
  'x-forwarded-for',
  'x-forwarded-proto',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'expect',
  ENTRYPOINT_KEY_HEADER,
]);

/**
 * Forwards through the gateway's Nginx with the service's Host, on the internal listener. Nginx
 * takes the client's address from X-Real-IP there, and the headers the service's rate limits are
 * keyed on go along, so the model API's users get their own buckets as on the service's domain.
 */
export function nginxForwarder(o: NginxForwarderOptions): Forwarder {
  if (typeof o.socketPath !== 'string' || !o.socketPath.startsWith('/'))
    throw new TypeError(`socketPath must be an absolute path, got ${String(o.socketPath)}`);
  const pool = new Http1Pool({
    connect: async () => netConnect({ path: o.socketPath }),
    maxConnections: o.connections ?? 256,
    headersTimeoutMs: o.headersTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
    bodyTimeoutMs: o.bodyTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
  });
  return {
    async forward(service, req) {
      if (!service.domain) throw new ModelApiError(503, `Service ${serviceKey(service)} has no domain on this gateway`);
      const headers = ['host', service.domain, ...JSON_HEADERS, ...clientHeaders(service, req.client)];
      return exchange(pool, { method: 'POST', path: req.path, headers, body: req.body }, req.signal);
    },
    close: () => pool.close(),
  };
}

/** X-Real-IP, X-Forwarded-* and the client's values of the headers a rate limit is keyed on. */
function clientHeaders(service: Service, client: ForwardedClient | undefined): string[] {
  if (!client) return [];
  const out = ['x-real-ip', client.address, 'x-forwarded-for', client.forwardedFor, 'x-forwarded-proto', client.proto];
  const seen = new Set<string>();
  for (const rl of service.rateLimits) {
    if (rl.key.type !== 'header') continue;
    const name = rl.key.header.toLowerCase();
    if (OWN_HEADERS.has(name) || seen.has(name)) continue;
    seen.add(name);
    const v = client.headers[name];
    // Nginx keys a limit on the first value of a repeated header.
    const value = Array.isArray(v) ? v[0] : v;
    if (value !== undefined) out.push(name, value);
  }
  return out;
}

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
