// One keep-alive HTTP/1.1 connection over any Duplex (a TCP socket, an SSH channel, a balancer
// socket) and the exchange it carries. The request head is written as one string; a body is
// streamed with backpressure (raw with a Content-Length, else chunked); the response is parsed
// incrementally and handed over as it comes, pausing the Duplex while the handler is behind.
// A connection goes back to its pool only after a complete response to a completely sent request
// with keep-alive; anything else (abort, timeout, a half-read or odd response) closes it.

import type { Duplex, Readable } from 'node:stream';
import { ResponseParser, type ResponseSink } from './parser.js';
import { withErrorPath } from './streams.js';
import { Http1Error, type Http1Exchange, type Http1Handler, type Http1Request } from './types.js';

/** What a connection needs from its pool. */
export interface ConnectionOwner {
  /** Advances while the pool has connections; activity stamps and timeouts are in ticks. */
  readonly tick: number;
  /** Host header sent when a request has none. */
  readonly host: string;
  /** The response is complete and the connection reusable. */
  release(conn: Http1Connection): void;
  /** The connection closed; `ex` (if any) was in flight and gets `err` or another try. */
  closed(conn: Http1Connection, ex: Exchange | null, err: Error): void;
}

/** Methods a client may send again (RFC 9110 §9.2.2) after a connection died before answering. */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']);

/** The request may go out once more: idempotent, and its body (if any) can be sent again (not a stream). */
export function canResend(req: Http1Request): boolean {
  const b = req.body;
  return IDEMPOTENT.has(req.method) && (b === null || b === undefined || typeof b === 'string' || Buffer.isBuffer(b));
}
const NEEDS_LENGTH = new Set(['POST', 'PUT', 'PATCH']);
/** CR, LF and NUL would end a header line early (request smuggling); other CTLs are refused too. */
const BAD_VALUE = /[^\t\x20-\x7e\x80-\xff]/;
const BAD_TARGET = /[^\x21-\x7e\x80-\xff]/;
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** A request from dispatch() to its end. */
export class Exchange implements Http1Exchange {
  conn: Http1Connection | null = null;
  finished = false;
  /** Sent once more already (stale keep-alive connection). */
  retried = false;

  constructor(
    readonly req: Http1Request,
    readonly handler: Http1Handler,
  ) {}

  get unsent(): boolean {
    return !this.finished && this.conn === null && !this.retried;
  }

  /** May go out again on another connection: idempotent, and the body (if any) can be re-sent. */
  get replayable(): boolean {
    return !this.retried && canResend(this.req);
  }

  abort(reason: Error = new Http1Error('DP_HTTP1_ABORTED', 'the request was aborted')): void {
    if (this.finished) return;
    const conn = this.conn;
    if (conn !== null) conn.kill();
    this.fail(reason);
  }

  resume(): void {
    if (!this.finished) this.conn?.resume();
  }

  fail(err: Error): void {
    if (this.finished) return;
    this.finished = true;
    this.handler.onResponseError(err);
  }
}

export class Http1Connection implements ResponseSink {
  readonly socket: Duplex;
  readonly parser: ResponseParser;
  ex: Exchange | null = null;
  /** Responses completed on this connection. */
  served = 0;
  /** The owner's tick at the last I/O. */
  stamp: number;
  /** Reading is paused for the handler. */
  paused = false;
  dead = false;
  readonly #owner: ConnectionOwner;
  #body: BodyWriter | null = null;
  #complete = false;
  #error: Error | null = null;

  constructor(owner: ConnectionOwner, socket: Duplex, maxHeaderSize?: number) {
    this.#owner = owner;
    this.socket = socket;
    this.parser = new ResponseParser(maxHeaderSize);
    this.stamp = owner.tick;
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('end', () => this.#onEnd());
    socket.on('error', (err: Error) => {
      this.#error ??= err;
    });
    socket.once('close', () => this.#onClose());
  }

  /** Send `ex` (the connection is idle). */
  run(ex: Exchange): void {
    const req = ex.req;
    ex.conn = this;
    this.ex = ex;
    this.#complete = false;
    this.stamp = this.#owner.tick;
    const head = requestHead(req, this.#owner.host);
    if (typeof head !== 'string') {
      this.ex = null;
      ex.conn = null;
      ex.fail(head);
      this.#owner.release(this);
      return;
    }
    this.parser.start(this, req.method === 'HEAD');
    const body = req.body;
    if (body === null || body === undefined) this.socket.write(head, 'latin1');
    else if (typeof body === 'string' || Buffer.isBuffer(body)) {
      this.socket.cork();
      this.socket.write(head, 'latin1');
      this.socket.write(body);
      this.socket.uncork();
    } else {
      this.socket.write(head, 'latin1');
      this.#body = new BodyWriter(this, body, declaredLength(req.headers));
    }
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.stamp = this.#owner.tick;
    this.socket.resume();
  }

  /** Close now; whatever is in flight is the caller's to fail. */
  kill(): void {
    this.dead = true;
    this.parser.stop();
    this.#stopBody();
    this.socket.destroy();
  }

  /** The request body is fully written. */
  bodySent(): void {
    this.#body = null;
  }

  /** The request body failed (its stream errored or ended early): the exchange fails. */
  bodyFailed(err: Error): void {
    const ex = this.ex;
    this.#body = null;
    this.kill();
    ex?.fail(err);
  }

  /** The owner's timer found the replica silent for too long. */
  timeout(err: Http1Error): void {
    const ex = this.ex;
    this.kill();
    ex?.fail(err);
  }

  markActive(): void {
    this.stamp = this.#owner.tick;
  }

  // ResponseSink: the parser calls these for the exchange in flight.
  onHead(status: number, statusText: string, headers: string[], contentLength: number): void {
    this.ex!.handler.onResponseStart(status, statusText, headers, contentLength);
  }

  onBody(chunk: Buffer, last: boolean): void {
    const ex = this.ex!;
    if (ex.finished) return;
    if (!ex.handler.onResponseData(chunk, last) && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
  }

  onEnd(): void {
    this.#complete = true;
    const ex = this.ex!;
    if (ex.finished) return;
    ex.finished = true;
    ex.handler.onResponseEnd();
  }

  #onData(chunk: Buffer): void {
    this.stamp = this.#owner.tick;
    const ex = this.ex;
    if (ex === null) {
      // Nothing was asked: a replica talking out of turn is not to be trusted with the next request.
      this.kill();
      return;
    }
    const err = this.parser.execute(chunk);
    if (err !== null) {
      this.kill();
      ex.fail(err);
    } else if (this.#complete) this.#afterResponse(ex);
  }

  #afterResponse(ex: Exchange): void {
    this.#complete = false;
    this.ex = null;
    ex.conn = null;
    if (this.dead) return;
    this.served++;
    // A request still being sent (the replica answered early) leaves the connection out of step.
    if (this.#body !== null || !this.parser.keepAlive) {
      this.kill();
      return;
    }
    if (this.paused) {
      this.paused = false;
      this.socket.resume();
    }
    this.#owner.release(this);
  }

  #onEnd(): void {
    const ex = this.ex;
    if (ex !== null && !this.dead) {
      const err = this.parser.finish();
      // The close decides: a stale keep-alive connection (nothing received) may be retried there.
      if (err !== null && this.parser.received) this.#error ??= err;
      else if (this.#complete) {
        // Read until close: the end completed it; the connection cannot be reused anyway.
        this.#complete = false;
        this.ex = null;
        ex.conn = null;
      }
    }
    this.kill();
  }

  #onClose(): void {
    this.dead = true;
    this.#stopBody();
    const ex = this.ex;
    this.ex = null;
    if (ex !== null) ex.conn = null;
    const cause = this.#error;
    const err =
      cause !== null && 'code' in cause && typeof cause.code === 'string' && cause.code.startsWith('DP_HTTP1_')
        ? cause
        : new Http1Error(
            'DP_HTTP1_CLOSED',
            cause ? `the connection to the replica failed: ${cause.message}` : 'the replica closed the connection',
            { cause },
          );
    this.#owner.closed(this, ex !== null && !ex.finished ? ex : null, err);
  }

  #stopBody(): void {
    const b = this.#body;
    this.#body = null;
    b?.stop();
  }
}

/** The request head, or the reason it cannot be sent. */
function requestHead(req: Http1Request, defaultHost: string): string | Http1Error {
  const check = req.validated !== true;
  if (check && (!TOKEN.test(req.method) || BAD_TARGET.test(req.path)))
    return new Http1Error('DP_HTTP1_BAD_REQUEST', 'invalid method or request target');
  let head = `${req.method} ${req.path} HTTP/1.1\r\n`;
  let host = false;
  let length = false;
  const h = req.headers;
  for (let i = 0; i < h.length; i += 2) {
    const name = h[i]!;
    const value = h[i + 1]!;
    const n = name.length;
    if (n === 4 && name.toLowerCase() === 'host') host = true;
    else if (n === 14 && name.toLowerCase() === 'content-length') length = true;
    if (check && (!TOKEN.test(name) || BAD_VALUE.test(value)))
      return new Http1Error('DP_HTTP1_BAD_REQUEST', `invalid request header ${JSON.stringify(name)}`);
    head += `${name}: ${value}\r\n`;
  }
  if (!host) head += `Host: ${defaultHost}\r\n`;
  const body = req.body;
  if (body === null || body === undefined) {
    // As browsers and undici do: an empty POST says so, or some servers wait for a body.
    if (!length && NEEDS_LENGTH.has(req.method)) head += 'Content-Length: 0\r\n';
  } else if (typeof body === 'string' || Buffer.isBuffer(body)) {
    if (!length) head += `Content-Length: ${Buffer.byteLength(body)}\r\n`;
  } else if (!length) head += 'Transfer-Encoding: chunked\r\n';
  return `${head}\r\n`;
}

/** The Content-Length among the headers, or -1 (then the body goes chunked). */
function declaredLength(h: readonly string[]): number {
  for (let i = 0; i < h.length; i += 2) {
    const name = h[i]!;
    if (name.length === 14 && name.toLowerCase() === 'content-length') return Number(h[i + 1]);
  }
  return -1;
}

/** Streams a request body into the connection: backpressure both ways, chunked when no length. */
class BodyWriter {
  #sent = 0;
  #done = false;

  constructor(
    private readonly conn: Http1Connection,
    private readonly body: Readable,
    /** -1: chunked. */
    private readonly length: number,
  ) {
    // stop() takes this writer's listeners off, but the body lives on (a client still sending,
    // or hanging up later): it keeps an error path of its own.
    withErrorPath(body);
    body.on('data', this.#onData);
    body.on('end', this.#onEnd);
    body.on('error', this.#onError);
    body.on('close', this.#onClose);
    if (body.destroyed) {
      // It failed while the request waited for a connection: its 'error' and 'close' are past.
      const err = body.errored ?? new Http1Error('DP_HTTP1_ABORTED', 'the request body ended early');
      process.nextTick(() => this.#fail(err));
      return;
    }
    if (body.isPaused()) body.resume();
  }

  stop(): void {
    this.#done = true;
    const b = this.body;
    b.off('data', this.#onData);
    b.off('end', this.#onEnd);
    b.off('error', this.#onError);
    b.off('close', this.#onClose);
    this.conn.socket.off('drain', this.#onDrain);
  }

  readonly #onData = (chunk: Buffer | string): void => {
    const data = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    const socket = this.conn.socket;
    this.conn.markActive();
    this.#sent += data.length;
    let ok: boolean;
    if (this.length === -1) {
      if (data.length === 0) return; // a zero-size chunk would end the body
      socket.cork();
      socket.write(`${data.length.toString(16)}\r\n`, 'latin1');
      socket.write(data);
      ok = socket.write('\r\n', 'latin1');
      socket.uncork();
    } else {
      if (this.#sent > this.length)
        return this.#fail(new Http1Error('DP_HTTP1_BODY_LENGTH', `the request body is longer than its Content-Length ${this.length}`));
      ok = socket.write(data);
    }
    if (!ok) {
      this.body.pause();
      socket.once('drain', this.#onDrain);
    }
  };

  readonly #onDrain = (): void => {
    if (!this.#done) this.body.resume();
  };

  readonly #onEnd = (): void => {
    if (this.#done) return;
    if (this.length === -1) this.conn.socket.write('0\r\n\r\n', 'latin1');
    else if (this.#sent !== this.length)
      return this.#fail(new Http1Error('DP_HTTP1_BODY_LENGTH', `the request body is shorter than its Content-Length ${this.length}`));
    this.stop();
    this.conn.bodySent();
  };

  readonly #onError = (err: Error): void => {
    this.#fail(err);
  };

  readonly #onClose = (): void => {
    if (!this.#done) this.#fail(new Http1Error('DP_HTTP1_ABORTED', 'the request body ended early'));
  };

  #fail(err: Error): void {
    if (this.#done) return;
    this.stop();
    this.conn.bodyFailed(err);
  }
}
