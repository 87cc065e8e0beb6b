// How a chat request reaches a replica. Injected into the plugin so that both deployments share
// it: the gateway goes through its own Nginx (load balancing, rate limits and stats like any other
// request) on the internal listener — a Unix socket only the gateway can connect to, whose
// servers skip auth_request (the plugin checked the token) and take the client's address from the
// X-Real-IP sent here, so limits keyed by address or header count per client; the in-server
// proxy through the data plane (the SSH loop's `replicas`), the same per-request choice and
// per-replica pools as /proxy/services. Both send with the lean HTTP/1.1 client of src/http1,
// keep connections alive, stream the response body, and read a small non-streaming answer whole
// (upstream.ts).

import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { connect as netConnect, isIP } from 'node:net';
import type { ReplicaRouter } from '../dataplane/router.js';
import { Http1Pool } from '../http1/index.js';
import { ROUTER_PATH_REFUSED, routerPathAllowed } from '../server-proxy/paths.js';
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
      return exchange((r, h) => pool.dispatch(r, h), { method: 'POST', path: req.path, headers, body: req.body }, req.signal);
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

/**
 * Forwards through the data plane: each request goes to the Ready replica of the service with the
 * fewest in flight, on that replica's keep-alive pool (shared with /proxy/services); connect and
 * read timeouts are the data plane's. Its failures (no Ready replica: 503) become the client's
 * status through toModelError.
 */
export function replicaForwarder(replicas: ReplicaRouter): Forwarder {
  return {
    forward(service, req) {
      // The allowlist the service's proxied paths get applies to the model API's calls too (on
      // the gateway its Nginx site refuses them; here nothing else would): a model whose prefix
      // falls outside it is refused before any replica, in the same words.
      if (service.routerAllowlist === true && !routerPathAllowed(req.path)) {
        return Promise.reject(new ModelApiError(403, ROUTER_PATH_REFUSED));
      }
      const key = serviceKey(service);
      // A replica's own name for itself is unknown here: the service's domain when it has one.
      const headers = ['host', service.domain ?? 'localhost', ...JSON_HEADERS];
      return exchange((r, h) => replicas.dispatch(key, r, h), { method: 'POST', path: req.path, headers, body: req.body }, req.signal);
    },
    // The pools are the data plane's, closed with it.
    close: async () => undefined,
  };
}
