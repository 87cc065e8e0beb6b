// The in-server proxy's fast path: proxied requests skip fastify, and most skip Node's HTTP
// server too. Why: for a proxied request, fastify's routing and its request and reply objects,
// and then Node's own request and response objects, cost more than the proxying itself; the
// fast path serves the same proxyHttp without them.
//
// How, and why it is the most fragile code here: it takes over listeners fastify and Node
// installed on the server. The 'request' listener (fastify's) is replaced by one that proxies
// /proxy/services/ itself and calls fastify for everything else; the 'connection' listener
// (Node's HTTP server) is replaced by the raw path (raw/connection.ts), which hands a connection
// back to Node's listener when a request is not one it serves. Handing back relies on a private
// detail of Node: a socket whose handle is marked `_consumed` is read through 'data' events, so
// the bytes the raw path already read can be put back with unshift. Every condition under which
// the listeners are not what this expects turns the fast path off instead.

import type { FastifyInstance } from 'fastify';
import { maxHeaderSize as defaultMaxHeaderSize, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Server as TlsServer } from 'node:tls';
import type { Logger } from 'pino';
import { every } from '../clock.js';
import { sendDetail } from '../dataplane/detail.js';
import { plainIp } from './headers.js';
import { proxyHttp, type HttpProxyContext, type ProxyRequest, type ProxyResponse } from './http-proxy.js';
import { SERVICES_PATH } from './paths.js';
import { RawConnection } from './raw/connection.js';

/** How often idle raw connections are looked for: one timer for all of them, not one each. */
const SWEEP_INTERVAL_MS = 1_000;

/**
 * Put the proxy in front of Node's HTTP handling for /proxy/services/ requests, on a plain
 * HTTP/1 server with fastify as its only listener and no trustProxy (req.ip and req.protocol
 * would then come from X-Forwarded-*); otherwise the fastify routes serve. Two layers:
 * - connections start on the raw path (raw/connection.ts), which serves simple proxied requests
 *   itself and hands everything else to Node's server;
 * - on Node's server, the 'request' listener proxies /proxy/services/ before fastify routes.
 * Returns the raw connections open now (closed at shutdown), or null when the fast path is off.
 */
export function installFastPath(
  app: FastifyInstance,
  ctx: HttpProxyContext,
  closing: () => boolean,
  logger: Logger | undefined,
): Set<RawConnection> | null {
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
    if (!req.url?.startsWith(SERVICES_PATH) || closing()) return fastify.call(this, req, res);
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
    clock: ctx.clock,
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
  const stopSweeping = every(ctx.clock, SWEEP_INTERVAL_MS, () => {
    const now = ctx.clock.now();
    for (const c of open) c.sweep(now);
  });
  server.once('close', stopSweeping);
  server.on('connection', function onConnection(this: Server, socket: Socket): void {
    if (closing()) return node.call(this, socket);
    open.add(new RawConnection(socket, options, gone));
  });
  return open;
}
