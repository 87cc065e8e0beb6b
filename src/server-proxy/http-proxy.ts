// One proxied HTTP request: admit (404/403/429/413) → pick a pooled connection to a Ready
// replica → stream the body up (counted against clientMaxBodySize when it has no length) →
// stream the response down with the replica's status. Nothing is buffered: undici writes
// into the ServerResponse and waits for 'drain', the request stream is read only as fast as
// the replica takes it.

import type { IncomingMessage, ServerResponse } from 'node:http';
import { STATUS_CODES } from 'node:http';
import { performance } from 'node:perf_hooks';
import { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { admit, type AdmitContext } from './admit.js';
import { downstreamResponseHeaders, upstreamRequestHeaders } from './headers.js';
import { parseProxyTarget, upstreamTarget } from './paths.js';
import type { InProcessStats } from './stats.js';
import { upstreamError, type UpstreamPools } from './upstream.js';

export interface HttpProxyContext extends AdmitContext {
  pools: UpstreamPools;
  stats: InProcessStats;
  readTimeoutMs: number;
  logger?: Logger;
}

/** The request body passed clientMaxBodySize while streaming. */
export class BodyTooLargeError extends Error {
  readonly code = 'DP_BODY_TOO_LARGE';
  constructor(readonly limit: number) {
    super(`Request body is larger than ${limit} bytes`);
    this.name = 'BodyTooLargeError';
  }
}

export function hasBody(req: IncomingMessage): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

/** A JSON `{detail}` answer. An unread request body is not drained: the connection closes. */
export function sendDetail(req: IncomingMessage, res: ServerResponse, status: number, detail: string, extra: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ detail });
  const headers: Record<string, string | number> = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...extra };
  if (hasBody(req) && !req.readableEnded) headers.connection = 'close';
  res.writeHead(status, headers);
  res.end(body);
}

async function* limited(body: Readable, limit: number): AsyncGenerator<Buffer> {
  let n = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    n += chunk.length;
    if (n > limit) throw new BodyTooLargeError(limit);
    yield chunk;
  }
}

export async function proxyHttp(ctx: HttpProxyContext, req: IncomingMessage, res: ServerResponse, clientIp: string, proto: string): Promise<void> {
  const started = performance.now();
  const url = req.url ?? '/';
  const t = parseProxyTarget(url);
  if (!t) return sendDetail(req, res, 404, 'Not Found');
  if (t.rest === '') {
    // dstack: 308 to the trailing slash, absolute from the Host header, query kept; no lookup.
    const host = req.headers.host;
    const location = `${host ? `${proto}://${host}` : ''}${t.path}/${t.query}`;
    res.writeHead(308, { location, 'content-length': 0, ...(hasBody(req) ? { connection: 'close' } : {}) });
    res.end();
    return;
  }

  // 1. Admission: service, auth, rate limit, declared body size.
  const a = await admit(ctx, t, req.headers, clientIp);
  if (!a.ok) return sendDetail(req, res, a.status, a.detail, a.headers);
  const { service, key } = a;
  res.once('close', () => ctx.stats.record(key, performance.now() - started));

  // 2. The upstream request.
  const headers = upstreamRequestHeaders(req.rawHeaders, { clientIp, proto, dropAuthorization: service.auth });
  const limit = service.clientMaxBodySize;
  let body: Readable | null = null;
  if (hasBody(req)) body = limit > 0 && req.headers['content-length'] === undefined ? Readable.from(limited(req, limit), { objectMode: false }) : req;
  const abort = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) abort.abort();
  });

  // 3. Relay: headers and body as they come.
  try {
    await ctx.pools.get(key).stream(
      {
        path: upstreamTarget(t, service.stripPrefix),
        method: req.method as 'GET',
        headers,
        body,
        signal: abort.signal,
        headersTimeout: ctx.readTimeoutMs,
        bodyTimeout: ctx.readTimeoutMs,
      },
      ({ statusCode, headers: h }) => {
        res.writeHead(statusCode, STATUS_CODES[statusCode] ?? 'Unknown', downstreamResponseHeaders(h));
        return res;
      },
    );
  } catch (err) {
    if (abort.signal.aborted && !res.headersSent) return; // the client went away
    if (err instanceof BodyTooLargeError) return sendDetail(req, res, 413, err.message);
    if (res.headersSent) {
      ctx.logger?.debug({ service: key, err: (err as Error).message }, 'upstream response cut short');
      res.destroy();
      return;
    }
    const e = upstreamError(err, key);
    ctx.logger?.warn({ service: key, status: e.status, err: (err as Error).message }, 'upstream request failed');
    sendDetail(req, res, e.status, e.detail);
  }
}
