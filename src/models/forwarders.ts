// How a chat request reaches a replica. Injected into the plugin so that both deployments share
// it: the gateway goes through its own Nginx (load balancing, rate limits and stats like any other
// request; Nginx lets 127.0.0.1 past auth_request), the in-server proxy through the SSH loop's
// `connect(serviceKey)`. Both keep connections alive and stream the response body.

import type { Duplex, Readable } from 'node:stream';
import type { Socket } from 'node:net';
import { Agent, Pool, type Dispatcher } from 'undici';
import type { Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { ModelApiError } from './errors.js';

export interface UpstreamRequest {
  /** Path on the replica, e.g. `/v1/chat/completions` or `/generate_stream`. */
  path: string;
  body: Buffer | string;
  /** Aborted when the client goes away: the replica stops generating. */
  signal: AbortSignal;
}

export interface UpstreamResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** Streams as the replica sends. Consume or destroy it. */
  body: Readable;
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

async function send(dispatcher: Dispatcher, origin: string, host: string, req: UpstreamRequest, t: ForwarderTimeouts): Promise<UpstreamResponse> {
  const res = await dispatcher.request({
    origin,
    path: req.path,
    method: 'POST',
    headers: { host, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: req.body,
    signal: req.signal,
    headersTimeout: t.headersTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
    bodyTimeout: t.bodyTimeoutMs ?? DEFAULT_UPSTREAM_TIMEOUT_MS,
  });
  return { status: res.statusCode, headers: res.headers, body: res.body };
}

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
  const origin = `http://${o.host ?? '127.0.0.1'}:${o.httpPort}`;
  const pool = new Pool(origin, { connections: o.connections ?? 256, keepAliveTimeout: 60_000, pipelining: 1 });
  return {
    async forward(service, req) {
      if (!service.domain) throw new ModelApiError(503, `Service ${serviceKey(service)} has no domain on this gateway`);
      return send(pool, origin, service.domain, req, o);
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
 * Forwards over streams from `connect(serviceKey)`: an undici Agent whose connector returns that
 * Duplex, one keep-alive pool per service. A `connect` that throws a ModelApiError (say 503, no
 * Ready replica) gives the client that status; any other failure is a 502.
 */
export function connectForwarder(connect: ConnectFn, o: ConnectForwarderOptions = {}): Forwarder {
  const keys = new Map<string, string>(); // origin hostname → service key
  const hosts = new Map<string, string>(); // service key → origin hostname
  const agent = new Agent({
    connections: o.connectionsPerService ?? 64,
    keepAliveTimeout: 60_000,
    connect: (opts, callback) => {
      const key = keys.get(opts.hostname);
      if (key === undefined) {
        callback(new Error(`no service for ${opts.hostname}`), null);
        return;
      }
      Promise.resolve()
        .then(() => connect(key))
        .then(
          (stream) => callback(null, stream as unknown as Socket),
          (err: unknown) => callback(err instanceof Error ? err : new Error(String(err)), null),
        );
    },
  });
  return {
    async forward(service, req) {
      const key = serviceKey(service);
      let host = hosts.get(key);
      if (host === undefined) {
        host = `svc-${hosts.size + 1}.models.internal`;
        hosts.set(key, host);
        keys.set(host, key);
      }
      return send(agent, `http://${host}`, service.domain ?? host, req, o);
    },
    close: () => agent.close(),
  };
}
