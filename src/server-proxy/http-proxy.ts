// One proxied HTTP request: admit (404/403/429/413) → the data plane picks a Ready replica for
// this request and sends it on that replica's keep-alive pool → stream the body up (counted against clientMaxBodySize when it has no length) →
// stream the response down with the replica's status. Nothing is buffered: response chunks are
// written to the ServerResponse as they arrive and the replica's socket is paused until it
// drains; the request stream is read only as fast as the replica takes it.
//
// This is the hot path: one handler object per request on the HTTP/1.1 pool's
// dispatch() (no promise, no AbortController, no parsed header object), admission synchronous
// unless the service uses proxy auth, the stats count taken when the response closes.
//
// Failures: the data plane tries another replica when a connection cannot be opened, and sends
// an idempotent request without a streamed body once more elsewhere when the replica closed
// before answering; a POST, or a streamed body, then fails rather than risk sending it twice.
// Whatever failure is left is answered as the data plane's catalog says (statusFor): 503 no
// Ready replica, 502 the replica failed, 504 too slow, 413 body too large, nothing for a client
// that left.

import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { STATUS_CODES } from 'node:http';
import { performance } from 'node:perf_hooks';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import type { Logger } from 'pino';
import type { Clock } from '../clock.js';
import { hasDuplicateHost, withErrorPath, type Http1Exchange, type Http1Handler } from '../http1/index.js';
import { admit, type Admission, type AdmitContext } from './admit.js';
import { hasBody, sendDetail } from '../dataplane/detail.js';
import { DataPlaneError, statusFor } from '../dataplane/errors.js';
import type { ReplicaRouter } from '../dataplane/router.js';
import { downstreamRawHeaders, upstreamRequestHeaders } from './headers.js';
import { parseProxyTarget, upstreamTarget, type ProxyTarget } from './paths.js';
import type { InProcessStats } from './stats.js';

/** What the proxy reads of a request: Node's IncomingMessage, or one read by the raw fast path (raw/connection.ts). */
export interface ProxyRequest {
  readonly url?: string | undefined;
  readonly method?: string | undefined;
  readonly headers: IncomingHttpHeaders;
  readonly rawHeaders: string[];
  readonly readableEnded: boolean;
  /** The whole body, already read (raw fast path); absent on an IncomingMessage, which is the body stream. */
  readonly bufferedBody?: Buffer;
  /** The declared Content-Length, -1 for none (raw fast path); else read from the headers. */
  readonly contentLength?: number;
}

/** What the proxy does with a response: Node's ServerResponse, or the raw fast path's. */
export interface ProxyResponse {
  readonly headersSent: boolean;
  readonly destroyed: boolean;
  readonly writableFinished: boolean;
  writeHead(status: number, reason: string, headers: string[]): unknown;
  writeHead(status: number, headers: Record<string, string | number>): unknown;
  write(chunk: Buffer): boolean;
  end(chunk?: Buffer | string): unknown;
  destroy(): unknown;
  on(event: 'close', listener: () => void): unknown;
  once(event: 'drain', listener: () => void): unknown;
}

export interface HttpProxyContext extends AdmitContext {
  /** The data plane: the replica for each request, and its keep-alive pool. */
  replicas: ReplicaRouter;
  /** Idle connections and streams are timed on it. */
  clock: Clock;
  stats: InProcessStats;
  logger?: Logger;
}

/**
 * A body without a length (chunked), counted against clientMaxBodySize on its way up. It owns
 * its failures for its whole life: the client hanging up mid-body destroys it with an error, and
 * that error has a listener even when nobody reads the body any more (the replica answered
 * early, or the exchange was aborted).
 */
class LimitedBody extends Transform {
  #n = 0;

  constructor(
    source: IncomingMessage,
    private readonly limit: number,
  ) {
    super();
    withErrorPath(this);
    source.on('error', (err: Error) => this.destroy(err));
    // A request that closes before its last byte: the body ends with an error, not a short 'end'.
    source.once('close', () => {
      if (!source.complete) this.destroy(new DataPlaneError('DP_ERR_CLIENT_CLOSED', 'the client closed the connection mid-body'));
    });
    source.pipe(this);
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, cb: TransformCallback): void {
    this.#n += chunk.length;
    if (this.#n > this.limit) cb(new DataPlaneError('DP_ERR_BODY_TOO_LARGE', `Request body is larger than ${this.limit} bytes`));
    else cb(null, chunk);
  }
}

/** Proxy one request; never throws (failures become a JSON answer or a cut connection). */
export function proxyHttp(ctx: HttpProxyContext, req: ProxyRequest, res: ProxyResponse, clientIp: string, proto: string): void {
  const started = performance.now();
  // Node's parser keeps both; the raw path's refuses them (and hands the request here through Node).
  if (req.bufferedBody === undefined && hasDuplicateHost(req.rawHeaders)) return sendDetail(req, res, 400, 'More than one Host header');
  const t = parseProxyTarget(req.url ?? '/');
  if (!t) return sendDetail(req, res, 404, 'Not Found');
  if (t.rest === '') {
    // dstack: 308 to the trailing slash, absolute from the Host header, query kept; no lookup.
    const host = req.headers.host;
    const location = `${host ? `${proto}://${host}` : ''}${t.path}/${t.query}`;
    res.writeHead(308, { location, 'content-length': 0, ...(hasBody(req) ? { connection: 'close' } : {}) });
    res.end();
    return;
  }

  // 1. Admission: service, auth, rate limit, declared body size (async only for proxy auth).
  const a = admit(ctx, t, req, clientIp);
  if (a instanceof Promise) {
    a.then(
      (r) => relay(ctx, req, res, clientIp, proto, t, r, started),
      (err: unknown) => {
        ctx.logger?.error({ err }, 'server proxy failed');
        sendDetail(req, res, 500, 'Internal Server Error');
      },
    );
  } else relay(ctx, req, res, clientIp, proto, t, a, started);
}

function relay(
  ctx: HttpProxyContext,
  req: ProxyRequest,
  res: ProxyResponse,
  clientIp: string,
  proto: string,
  t: ProxyTarget,
  a: Admission,
  started: number,
): void {
  if (!a.ok) return sendDetail(req, res, a.status, a.detail, a.headers);
  const { service, key } = a;
  if (res.destroyed) return; // the client left while auth was asked

  // 2. The upstream request.
  const headers = upstreamRequestHeaders(req.rawHeaders, { clientIp, proto, dropAuthorization: service.auth });
  const limit = service.clientMaxBodySize;
  let body: Readable | Buffer | null = null;
  if (req.bufferedBody !== undefined) body = req.bufferedBody.length > 0 ? req.bufferedBody : null;
  else if (hasBody(req)) {
    const stream = req as IncomingMessage; // no bufferedBody: Node's request, the body stream itself
    body = limit > 0 && req.headers['content-length'] === undefined ? new LimitedBody(stream, limit) : stream;
  }

  // 3. Relay: headers and body as they come.
  const handler = new RelayHandler(ctx, req, res, key, started);
  res.on('close', handler.onClientClose); // once: a response closes once, without a wrapper per request
  handler.exchange = ctx.replicas.dispatch(
    key,
    // Method, target and headers passed Node's parser (plus our X-Forwarded-* from the socket): no second check.
    { method: req.method ?? 'GET', path: upstreamTarget(t, service.stripPrefix), headers, body, validated: true },
    handler,
  );
}

/** The data plane's handler for one request, writing straight into the ServerResponse. */
class RelayHandler implements Http1Handler {
  exchange: Http1Exchange | null = null;
  #clientGone = false;
  #done = false;

  constructor(
    private readonly ctx: HttpProxyContext,
    private readonly req: ProxyRequest,
    private readonly res: ProxyResponse,
    private readonly key: string,
    private readonly started: number,
  ) {}

  /** The response closed: counted; an unfinished exchange is aborted upstream. */
  readonly onClientClose = (): void => {
    this.ctx.stats.record(this.key, performance.now() - this.started);
    if (this.res.writableFinished || this.#done) return;
    this.#clientGone = true;
    this.exchange?.abort(new DataPlaneError('DP_ERR_CLIENT_CLOSED', 'the client went away'));
  };

  readonly #onDrain = (): void => {
    this.exchange?.resume();
  };

  onResponseStart(statusCode: number, statusText: string, headers: string[], contentLength: number): void {
    // Framed by us: the replica's Content-Length and Transfer-Encoding are dropped, and the length
    // the parser checked goes out (else the response is chunked or, for HTTP/1.0, closed).
    const out = downstreamRawHeaders(headers);
    if (contentLength >= 0) out.push('Content-Length', String(contentLength));
    this.res.writeHead(statusCode, STATUS_CODES[statusCode] ?? (statusText || 'Unknown'), out);
  }

  onResponseData(chunk: Buffer, last: boolean): boolean {
    if (last) {
      // Headers and the whole body in one write, no second pass through res.end().
      this.#done = true;
      this.res.end(chunk);
      return true;
    }
    if (this.res.write(chunk)) return true;
    this.res.once('drain', this.#onDrain);
    return false;
  }

  onResponseEnd(): void {
    if (this.#done) return;
    this.#done = true;
    this.res.end();
  }

  onResponseError(err: Error): void {
    this.#done = true;
    const { ctx, req, res, key } = this;
    if (this.#clientGone) return;
    const e = statusFor(err, key);
    // Past the head the status is sent: a cut connection is all the client can be told. A client
    // that left mid-body gets no answer.
    if (res.headersSent || e.code === 'DP_ERR_CLIENT_CLOSED') {
      ctx.logger?.debug({ service: key, err: err.message }, 'upstream response cut short');
      res.destroy();
      return;
    }
    if (e.status >= 500) ctx.logger?.warn({ service: key, status: e.status, err: err.message }, 'upstream request failed');
    sendDetail(req, res, e.status, e.detail);
  }
}
