// WebSocket (and any other Upgrade) through the in-server proxy, which dstack refuses:
// the same admission as HTTP, then the handshake is written to a raw stream the data plane pins
// to one replica (`open`: counted in flight there for the stream's whole life, never moved to
// another replica) and both sockets are piped until either side closes, or until nothing
// has moved either way for the read timeout (like Nginx's proxy_read_timeout on an upgraded
// connection; a WebSocket kept open by pings is never idle). The replica's 101 (or refusal)
// reaches the client byte for byte.

import type { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Duplex } from 'node:stream';
import type { TimerHandle } from '../clock.js';
import { hasDuplicateHost } from '../http1/index.js';
import { admit } from './admit.js';
import { rawDetail, rawReply } from '../dataplane/detail.js';
import { statusFor } from '../dataplane/errors.js';
import { upstreamRequestHeaders } from './headers.js';
import type { HttpProxyContext } from './http-proxy.js';
import { parseProxyTarget, upstreamTarget } from './paths.js';

export interface UpgradeContext extends HttpProxyContext {
  /** No bytes either way for this long closes both sockets. */
  readTimeoutMs: number;
}

/** True when the upgrade was ours (a /proxy/services path). */
export function handleUpgrade(
  ctx: UpgradeContext,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  clientIp: string,
  proto: string,
): boolean {
  const t = parseProxyTarget(req.url ?? '/');
  if (!t) return false;
  socket.on('error', () => socket.destroy());
  void (async () => {
    const started = performance.now();
    if (hasDuplicateHost(req.rawHeaders)) return rawDetail(socket, 400, 'More than one Host header');
    if (t.rest === '') {
      const host = req.headers.host;
      return rawReply(socket, 308, { Location: `${host ? `${proto}://${host}` : ''}${t.path}/${t.query}` });
    }
    const a = await admit(ctx, t, req, clientIp);
    if (!a.ok) return rawDetail(socket, a.status, a.detail);
    let up: Duplex;
    try {
      up = await ctx.replicas.open(a.key);
    } catch (err) {
      const e = statusFor(err, a.key);
      ctx.logger?.warn({ service: a.key, status: e.status, err: (err as Error).message }, 'upstream upgrade failed');
      return rawDetail(socket, e.status, e.detail);
    }
    if (socket.destroyed) return void up.destroy();
    const h = upstreamRequestHeaders(req.rawHeaders, { clientIp, proto, dropAuthorization: a.service.auth, upgrade: true });
    let text = `${req.method ?? 'GET'} ${upstreamTarget(t, a.service.stripPrefix)} HTTP/1.1\r\n`;
    for (let i = 0; i < h.length; i += 2) text += `${h[i]}: ${h[i + 1]}\r\n`;
    up.write(`${text}\r\n`);
    if (head.length > 0) up.write(head);
    ctx.stats.record(a.key, performance.now() - started);
    if (socket instanceof Socket) socket.setNoDelay(true);
    up.on('error', () => up.destroy());
    // One timer for both directions: a chunk only notes the time, and the timer, when it fires
    // early, waits out the rest (a timer per chunk would cost more than the chunk).
    // The service's own read timeout, as Nginx's proxy_read_timeout of its site.
    const idleMs = a.service.readTimeout !== undefined ? a.service.readTimeout * 1000 : ctx.readTimeoutMs;
    const { clock } = ctx;
    let last = clock.now();
    let idle: TimerHandle;
    const check = (): void => {
      const left = last + idleMs - clock.now();
      if (left > 0) {
        idle = clock.setTimeout(check, left);
        return;
      }
      ctx.logger?.debug({ service: a.key, idleMs }, 'WebSocket idle past the read timeout, closed');
      socket.destroy();
      up.destroy();
    };
    idle = clock.setTimeout(check, idleMs);
    up.once('close', () => {
      clock.clearTimeout(idle);
      socket.destroy();
    });
    socket.once('close', () => {
      clock.clearTimeout(idle);
      up.destroy();
    });
    socket.pipe(up);
    up.pipe(socket);
    const active = (): void => void (last = clock.now());
    socket.on('data', active);
    up.on('data', active);
  })().catch((err: unknown) => {
    ctx.logger?.error({ err }, 'WebSocket proxy failed');
    socket.destroy();
  });
  return true;
}
