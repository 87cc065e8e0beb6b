// registerServerProxy(app, options): `/proxy/services/:project/:run[/*]` on a fastify app,
// for every method, plus WebSocket upgrades on app.server. A host server passes its own
// getState/replicas/authorize; the standalone `server-proxy` command passes the database
// document, the in-process SSH loop's replicas (the data plane: per-request choice, per-replica
// keep-alive pools, connect and read timeouts) and the control-server check.
//
// The proxy runs in the route's onRequest hook and hijacks the reply there: fastify never reads
// or parses the body (no content-type parser, no bodyLimit, no 415 for odd media types).
// On a plain HTTP/1 server (no trustProxy), requests under /proxy/services/ bypass fastify
// (`fastPath`, default on; fast-path.ts says how and why). The routes stay for app.inject() and
// for servers where the fast path is off; both run the same proxyHttp.

import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../clock.js';
import type { ProxyState, Service } from '../spec/types.js';
import { ServiceIndex, type Authorize } from './admit.js';
import { rawDetail, sendDetail } from '../dataplane/detail.js';
import { DEFAULT_READ_TIMEOUT_MS } from '../dataplane/replicas.js';
import type { ReplicaRouter } from '../dataplane/router.js';
import { plainIp } from './headers.js';
import { installFastPath } from './fast-path.js';
import { proxyHttp, type HttpProxyContext } from './http-proxy.js';
import { SERVICES_PREFIX } from './paths.js';
import { RateLimiter } from './rate-limit.js';
import { createInProcessStats, type InProcessStats } from './stats.js';
import { handleUpgrade, type UpgradeContext } from './websocket.js';

export interface ServerProxyOptions {
  /** The current document; called per request (cheap: the service index is rebuilt only when the object changes). */
  getState: () => ProxyState;
  /** The data plane (the SSH loop's `replicas`): a replica per request, or a stream pinned to one. */
  replicas: ReplicaRouter;
  /** Is `token` a member's token of `project`? Asked only for services with `auth: true`. */
  authorize: Authorize;
  /** Where requests are counted. Default a new in-process collector. */
  stats?: InProcessStats;
  /**
   * A WebSocket with no bytes either way for this long is closed. Default 300 s. (HTTP's connect
   * and read timeouts are the data plane's own options.)
   */
  readTimeoutMs?: number;
  /** For rate limits, stats and idle connections. Default the system clock. */
  clock?: Clock;
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
}

export async function registerServerProxy(app: FastifyInstance, o: ServerProxyOptions): Promise<ServerProxy> {
  const r = o.replicas as Partial<ReplicaRouter> | undefined;
  if (
    typeof o.getState !== 'function' ||
    typeof r?.dispatch !== 'function' ||
    typeof r.open !== 'function' ||
    typeof o.authorize !== 'function'
  ) {
    throw new TypeError('registerServerProxy needs getState and authorize functions and replicas (dispatch, open)');
  }
  const readTimeoutMs = o.readTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS;
  if (!Number.isFinite(readTimeoutMs) || readTimeoutMs <= 0)
    throw new TypeError(`registerServerProxy: readTimeoutMs must be > 0, got ${readTimeoutMs}`);
  const stats = o.stats ?? createInProcessStats(o.clock ? { clock: o.clock } : {});
  const limiter = new RateLimiter(o.clock ? { clock: o.clock } : {});
  const onServices = (services: readonly Service[]): void => limiter.retain(services);
  const ctx: UpgradeContext & HttpProxyContext = {
    index: new ServiceIndex(o.getState, onServices),
    authorize: o.authorize,
    limiter,
    replicas: o.replicas,
    stats,
    readTimeoutMs,
    clock: o.clock ?? systemClock,
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
      scope.setNotFoundHandler((req, reply) => {
        reply.hijack();
        sendDetail(req.raw, reply.raw, 404, 'Not Found');
      });
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
    if (!handled && app.server.listenerCount('upgrade') === 1) rawDetail(socket, 404, 'Not Found');
  };
  app.server.on('upgrade', onUpgrade);
  app.addHook('preClose', async () => {
    closing = true; // fastify answers 503 while closing; the fast path hands over to it
    if (raw) for (const c of [...raw]) c.drain();
    app.server.off('upgrade', onUpgrade);
    for (const s of upgraded) s.destroy();
  });
  return { stats, limiter };
}
