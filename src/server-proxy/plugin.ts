// registerServerProxy(app, options): `/proxy/services/:project/:run[/*]` on a fastify app,
// for every method, plus WebSocket upgrades on app.server. A host server passes its own
// getState/connect/authorize; the standalone `server-proxy` command passes the database
// document, the in-process SSH loop's balancer and the control-server check.
//
// The proxy runs in the route's onRequest hook and hijacks the reply there: fastify never reads
// or parses the body (no content-type parser, no bodyLimit, no 415 for odd media types).
// On a plain HTTP/1 server (no trustProxy), requests under /proxy/services/ go straight from the
// server's 'request' event to the proxy (`fastPath`, default on): fastify's routing, request and
// reply objects cost more than the proxying itself. The routes stay for app.inject() and for
// servers where the fast path is off; both run the same proxyHttp.

import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import { maxHeaderSize as defaultMaxHeaderSize, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Server as TlsServer } from 'node:tls';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { ProxyState, Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { ServiceIndex, type Authorize } from './admit.js';
import { plainIp } from './headers.js';
import { proxyHttp, sendDetail, type HttpProxyContext, type ProxyRequest, type ProxyResponse } from './http-proxy.js';
import { SERVICES_PREFIX } from './paths.js';
import { RawConnection } from './raw/connection.js';
import { RateLimiter } from './rate-limit.js';
import { createInProcessStats, type InProcessStats } from './stats.js';
import { DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_READ_TIMEOUT_MS, UpstreamPools, type ConnectFn } from './upstream.js';
import { handleUpgrade, rawReply, type UpgradeContext } from './websocket.js';

export interface ServerProxyOptions {
  /** The current document; called per request (cheap: the service index is rebuilt only when the object changes). */
  getState: () => ProxyState;
  /** A new stream to a Ready replica of the service (the SSH loop's `balancer.connect`). */
  connect: ConnectFn;
  /** Is `token` a member's token of `project`? Asked only for services with `auth: true`. */
  authorize: Authorize;
  /** Where requests are counted. Default a new in-process collector. */
  stats?: InProcessStats;
  /** Opening a connection to a replica. Default 10 s; past it → 504. */
  connectTimeoutMs?: number;
  /** Waiting for response headers, and silence between body chunks. Default 300 s; before headers → 504. */
  readTimeoutMs?: number;
  /** Keep-alive connections per service at most. Default 256. */
  connectionsPerService?: number;
  /** For rate limits and stats. Default the system clock. */
  clock?: { now(): number };
  logger?: Logger;
  /**
   * Serve /proxy/services/ from the HTTP server's 'request' event, ahead of fastify. Default true.
   * App-wide fastify hooks (onRequest, onResponse…) then do not see proxied requests; set false
   * when a host server needs them. Off by itself with trustProxy or HTTP/2.
   */
  fastPath?: boolean;
}

export interface ServerProxy {
  stats: InProcessStats;
  limiter: RateLimiter;
  pools: UpstreamPools;
}

export async function registerServerProxy(app: FastifyInstance, o: ServerProxyOptions): Promise<ServerProxy> {
  if (typeof o.getState !== 'function' || typeof o.connect !== 'function' || typeof o.authorize !== 'function') {
    throw new TypeError('registerServerProxy needs getState, connect and authorize functions');
  }
  const connectTimeoutMs = o.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
  const readTimeoutMs = o.readTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS;
  for (const [name, v] of [['connectTimeoutMs', connectTimeoutMs], ['readTimeoutMs', readTimeoutMs]] as const) {
    if (!Number.isFinite(v) || v <= 0) throw new TypeError(`registerServerProxy: ${name} must be > 0, got ${v}`);
  }
  const stats = o.stats ?? createInProcessStats(o.clock ? { clock: o.clock } : {});
  const limiter = new RateLimiter(o.clock ? { clock: o.clock } : {});
  const pools = new UpstreamPools({
    connect: o.connect,
    connectTimeoutMs,
    readTimeoutMs,
    ...(o.connectionsPerService ? { connectionsPerService: o.connectionsPerService } : {}),
  });
  const onServices = (services: readonly Service[]): void => {
    pools.retain(new Set(services.map(serviceKey)));
    limiter.retain(services);
  };
  const ctx: UpgradeContext & HttpProxyContext = {
    index: new ServiceIndex(o.getState, onServices),
    authorize: o.authorize,
    limiter,
    pools,
    stats,
    connect: o.connect,
    connectTimeoutMs,
    readTimeoutMs,
    ...(o.logger ? { logger: o.logger } : {}),
  };

  const onRequest = (req: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void => {
    reply.hijack();
    try {
      proxyHttp(ctx, req.raw, reply.raw, plainIp(req.ip), req.protocol);
    } catch (err) {
      o.logger?.error({ err }, 'server proxy failed');
      sendDetail(req.raw, reply.raw, 500, 'Internal Server Error');
    }
    done();
  };
  const unreachable = async (): Promise<never> => {
    throw new Error('the server proxy answers in onRequest');
  };

  await app.register(
    async (scope) => {
      scope.all('/:project/:run', { onRequest }, unreachable);
      scope.all('/:project/:run/*', { onRequest }, unreachable);
      scope.setNotFoundHandler((_req, reply) => reply.code(404).send({ detail: 'Not Found' }));
    },
    { prefix: SERVICES_PREFIX },
  );

  let closing = false;
  const raw = o.fastPath !== false ? installFastPath(app, ctx, () => closing, o.logger) : null;

  // Upgraded sockets leave the HTTP server's bookkeeping: closed here at shutdown.
  const upgraded = new Set<Duplex>();
  const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    upgraded.add(socket);
    socket.once('close', () => upgraded.delete(socket));
    const s = socket as Duplex & { remoteAddress?: string; encrypted?: boolean };
    const handled = handleUpgrade(ctx, req, socket, head, plainIp(s.remoteAddress), s.encrypted ? 'https' : 'http');
    // Alone on the server, nobody else will answer an upgrade elsewhere.
    if (!handled && app.server.listenerCount('upgrade') === 1) rawReply(socket, 404, { 'Content-Type': 'application/json' }, '{"detail":"Not Found"}');
  };
  app.server.on('upgrade', onUpgrade);
  app.addHook('preClose', async () => {
    closing = true; // fastify answers 503 while closing; the fast path hands over to it
    if (raw) for (const c of [...raw]) c.drain();
    app.server.off('upgrade', onUpgrade);
    for (const s of upgraded) s.destroy();
  });
  app.addHook('onClose', async () => {
    await pools.close();
  });
  return { stats, limiter, pools };
}

const FAST_PREFIX = `${SERVICES_PREFIX}/`;

/**
 * Put the proxy in front of Node's HTTP handling for /proxy/services/ requests, on a plain
 * HTTP/1 server with fastify as its only listener and no trustProxy (req.ip and req.protocol
 * would then come from X-Forwarded-*); otherwise the fastify routes serve. Two layers:
 * - connections start on the raw path (raw/connection.ts), which serves simple proxied requests
 *   itself and hands everything else to Node's server;
 * - on Node's server, the 'request' listener proxies /proxy/services/ before fastify routes.
 * Returns the raw connections open now (closed at shutdown), or null when the fast path is off.
 */
function installFastPath(app: FastifyInstance, ctx: HttpProxyContext, closing: () => boolean, logger: Logger | undefined): Set<RawConnection> | null {
  const config = app.initialConfig as { http2?: boolean; trustProxy?: unknown };
  const server = app.server as unknown as Server;
  if (config.http2 || config.trustProxy || server.listenerCount('request') !== 1) return null;
  const fastify = server.listeners('request')[0] as (req: IncomingMessage, res: ServerResponse) => void;
  const serve = (req: ProxyRequest, res: ProxyResponse, clientIp: string, proto: string): void => {
    try {
      proxyHttp(ctx, req, res, clientIp, proto);
    } catch (err) {
      logger?.error({ err }, 'server proxy failed');
      sendDetail(req, res, 500, 'Internal Server Error');
    }
  };
  server.removeListener('request', fastify);
  server.on('request', function onRequest(this: Server, req: IncomingMessage, res: ServerResponse): void {
    if (!req.url?.startsWith(FAST_PREFIX) || closing()) return fastify.call(this, req, res);
    const socket = req.socket as Socket & { encrypted?: boolean };
    serve(req, res, plainIp(socket.remoteAddress), socket.encrypted ? 'https' : 'http');
  });

  const open = new Set<RawConnection>();
  // TLS servers hand Node's listener TLS sockets on 'secureConnection': the raw path is for plain TCP only.
  if (server instanceof TlsServer || server.listenerCount('connection') !== 1) return open;
  const node = server.listeners('connection')[0] as (socket: Socket) => void;
  server.removeListener('connection', node);
  const options = {
    serve: (req: ProxyRequest, res: ProxyResponse, clientIp: string) => serve(req, res, clientIp, 'http'),
    handover(socket: Socket, pending: Buffer | null): void {
      // Node's server reads through 'data' events when the handle is marked consumed (as for a
      // socket someone read before): the bytes put back with unshift then come first, in order.
      const handle = (socket as Socket & { _handle?: { _consumed?: boolean } | null })._handle;
      if (handle) handle._consumed = true;
      node.call(server, socket);
      if (pending !== null) socket.unshift(pending);
    },
    closing,
    get keepAliveTimeoutMs(): number {
      return server.keepAliveTimeout > 0 ? server.keepAliveTimeout : 5_000;
    },
    get headersTimeoutMs(): number {
      return server.headersTimeout > 0 ? server.headersTimeout : 60_000;
    },
    get maxHeaderSize(): number {
      return (server as Server & { maxHeaderSize?: number }).maxHeaderSize ?? defaultMaxHeaderSize;
    },
  };
  const gone = (c: RawConnection): void => void open.delete(c);
  const sweeper = setInterval(() => {
    const now = Date.now();
    for (const c of open) c.sweep(now);
  }, 1_000).unref();
  server.once('close', () => clearInterval(sweeper));
  server.on('connection', function onConnection(this: Server, socket: Socket): void {
    if (closing()) return node.call(this, socket);
    open.add(new RawConnection(socket, options, gone));
  });
  return open;
}
