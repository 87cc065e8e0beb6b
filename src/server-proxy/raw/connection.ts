// The raw fast path of the in-server proxy: plain HTTP/1.1 connections read straight from the
// TCP socket, without Node's http server, for the requests that make up nearly all proxied
// traffic (Node's request and response objects cost more than the proxying itself).
//
// A connection starts here. Each request head is parsed strictly (request-head.ts); a request
// is served here only when it is simple: HTTP/1.1 under /proxy/services/, no Transfer-Encoding,
// no Expect, no Upgrade, and a body (if any) of at most MAX_BUFFERED_BODY bytes that came with
// the head. Anything else — another path, a chunked or large upload, a
// WebSocket, HTTP/1.0, a body still on its way, the server closing — hands the connection, from that request's first
// byte on, to Node's http server, which serves it (and whatever follows) as if it had been there
// from the start. A head our strict parser refuses goes the same way: Node's server answers it
// (400, 431…), so the raw path never changes what a client that is not served here sees.
//
// Requests on one connection are answered in order (pipelined ones wait in the buffer). The
// response head is written with the first body bytes in one write; a response without a
// Content-Length is sent chunked. Idle connections close after the server's keepAliveTimeout
// (sweep(), from one timer for all of them); a head still incomplete after its headersTimeout is handed to Node's server too.

import { STATUS_CODES, type IncomingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';
import { headerObject } from '../../http1/field.js';
import { plainIp } from '../headers.js';
import type { ProxyRequest, ProxyResponse } from '../http-proxy.js';
import { SERVICES_PATH } from '../paths.js';
import { parseRequestHead, type RequestHead } from '../../http1/request-head.js';

/** A body up to this size is read whole and sent as one Buffer; a larger one goes to Node's server. */
export const MAX_BUFFERED_BODY = 64 * 1024;

/** A head still incomplete at this size goes to Node's server. */
const PARTIAL_HEAD_LIMIT = 4 * 1024;

export interface RawServerOptions {
  /** Serve one request (the proxy); must answer through `res`. */
  serve(req: RawRequest, res: RawResponse, clientIp: string): void;
  /** Give the connection to Node's http server; `pending` are bytes already read from it. */
  handover(socket: Socket, pending: Buffer | null): void;
  /** The server is shutting down: no new request is served here. */
  closing(): boolean;
  keepAliveTimeoutMs: number;
  headersTimeoutMs: number;
  maxHeaderSize: number;
  /** Idle and slow-head times are read from it (and swept on it). */
  clock: { now(): number };
}

/** A request read by the raw path, with the members the proxy reads of an IncomingMessage. */
export class RawRequest implements ProxyRequest {
  readonly readableEnded = true;
  readonly url: string;
  readonly method: string;
  readonly rawHeaders: string[];
  readonly bufferedBody: Buffer;
  readonly contentLength: number;
  #headers: IncomingHttpHeaders | null = null;

  constructor(head: RequestHead, body: Buffer) {
    this.url = head.target;
    this.method = head.method;
    this.rawHeaders = head.rawHeaders;
    this.bufferedBody = body;
    this.contentLength = head.contentLength;
  }

  /**
   * Folded as Node's IncomingMessage.headers, made on first use: only looked up (proxy auth, rate
   * limits, error answers), never forwarded, so a plain proxied request never builds it.
   */
  get headers(): IncomingHttpHeaders {
    return (this.#headers ??= headerObject(this.rawHeaders) as IncomingHttpHeaders);
  }
}

let dateSecond = -1;
let dateText = '';
/** The Date header value, made once a second. */
function httpDate(): string {
  const s = Math.floor(Date.now() / 1000);
  if (s !== dateSecond) {
    dateSecond = s;
    dateText = new Date(s * 1000).toUTCString();
  }
  return dateText;
}

/** A small first body piece is sent in the same write as the head (one string, one syscall). */
const JOIN_LIMIT = 16 * 1024;

/** The response to one RawRequest, with the members the proxy uses of a ServerResponse. */
export class RawResponse implements ProxyResponse {
  /** True once writeHead ran (as Node's: the head may still wait for the first body bytes). */
  headersSent = false;
  destroyed = false;
  writableFinished = false;
  #head: string | null = null;
  #chunked = false;
  #hasBody: boolean;
  #onClose: (() => void) | null = null;
  #closed = false;

  constructor(
    private readonly conn: RawConnection,
    private readonly socket: Socket,
    isHead: boolean,
    /** Keep the connection open after this response (the client's and the server's choice). */
    public keepAlive: boolean,
  ) {
    this.#hasBody = !isHead;
  }

  writeHead(status: number, reason: string, headers: string[]): this;
  writeHead(status: number, headers: Record<string, string | number>): this;
  writeHead(status: number, a: string | Record<string, string | number>, b?: string[]): this {
    if (this.headersSent) throw new Error('writeHead called twice');
    this.headersSent = true;
    let head = `HTTP/1.1 ${status} ${typeof a === 'string' ? a : (STATUS_CODES[status] ?? 'Unknown')}\r\n`;
    let length = false;
    const add = (name: string, value: string): void => {
      if (name.length === 14 && name.toLowerCase() === 'content-length') length = true;
      else if (name.length === 10 && name.toLowerCase() === 'connection') {
        if (value.toLowerCase() === 'close') this.keepAlive = false;
        return; // ours to say, below
      }
      head += `${name}: ${value}\r\n`;
    };
    if (typeof a === 'string') for (let i = 0; i < b!.length; i += 2) add(b![i]!, b![i + 1]!);
    else for (const name in a) add(name, String(a[name]));
    if (status === 204 || status === 304 || status < 200) this.#hasBody = false;
    else if (!length && this.#hasBody) {
      this.#chunked = true;
      head += 'Transfer-Encoding: chunked\r\n';
    }
    head += `Date: ${httpDate()}\r\n`;
    head += this.keepAlive ? this.conn.keepAliveHeader : 'Connection: close\r\n';
    this.#head = `${head}\r\n`;
    return this;
  }

  write(chunk: Buffer): boolean {
    if (this.destroyed || this.writableFinished) return false;
    const head = this.#takeHead();
    if (!this.#hasBody || chunk.length === 0) return head === '' || this.socket.write(head, 'latin1');
    if (this.#chunked) {
      const size = `${chunk.length.toString(16)}\r\n`;
      if (chunk.length <= JOIN_LIMIT) return this.socket.write(`${head}${size}${chunk.toString('latin1')}\r\n`, 'latin1');
      this.socket.cork();
      this.socket.write(head + size, 'latin1');
      this.socket.write(chunk);
      const ok = this.socket.write('\r\n', 'latin1');
      this.socket.uncork();
      return ok;
    }
    if (head === '') return this.socket.write(chunk);
    if (chunk.length <= JOIN_LIMIT) return this.socket.write(head + chunk.toString('latin1'), 'latin1');
    this.socket.cork();
    this.socket.write(head, 'latin1');
    const ok = this.socket.write(chunk);
    this.socket.uncork();
    return ok;
  }

  end(chunk?: Buffer | string): this {
    if (this.destroyed || this.writableFinished) return this;
    if (!this.headersSent) this.writeHead(200, {});
    if (chunk !== undefined && chunk.length > 0) this.write(typeof chunk === 'string' ? Buffer.from(chunk) : chunk);
    const head = this.#takeHead();
    const tail = this.#chunked && this.#hasBody ? '0\r\n\r\n' : '';
    if (head !== '' || tail !== '') this.socket.write(head + tail, 'latin1');
    this.writableFinished = true;
    this.#close();
    this.conn.responseDone(this);
    return this;
  }

  destroy(): this {
    if (this.destroyed) return this;
    this.destroyed = true;
    this.socket.destroy();
    this.#close();
    return this;
  }

  /** One 'close' listener (the proxy's), called once when the response ends or the socket closes. */
  on(_event: 'close', listener: () => void): this {
    this.#onClose = listener;
    return this;
  }

  once(_event: 'drain', listener: () => void): this {
    this.socket.once('drain', listener);
    return this;
  }

  /** The socket closed under this response (or it ended): 'close' listeners run once. */
  socketClosed(): void {
    if (!this.writableFinished) this.destroyed = true;
    this.#close();
  }

  #takeHead(): string {
    const head = this.#head;
    if (head === null) return '';
    this.#head = null;
    return head;
  }

  #close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const fn = this.#onClose;
    this.#onClose = null;
    fn?.();
  }
}

const EMPTY = Buffer.alloc(0);

/** One client connection on the raw path, until it closes or is handed to Node's server. */
export class RawConnection {
  /** Bytes read and not yet consumed (a partial head, a body, pipelined requests). */
  #buf: Buffer = EMPTY;
  #res: RawResponse | null = null;
  /** When the head now being read started arriving (ms), or -1. */
  #headStarted = -1;
  #gone = false;
  /** When the last response ended (ms; the connection's start before one), -1 while one is in flight. */
  #idleSince: number;
  readonly keepAliveHeader: string;
  readonly clientIp: string;
  readonly #onData = (chunk: Buffer): void => this.#data(chunk);
  readonly #onEnd = (): void => this.#ended();
  readonly #onError = (): void => undefined; // 'close' follows
  readonly #onClose = (): void => this.#closed();
  readonly #onPipelined = (): void => {
    if (!this.#gone && this.#res === null && this.#buf.length > 0) this.#next();
  };

  constructor(
    readonly socket: Socket,
    private readonly o: RawServerOptions,
    private readonly onGone: (c: RawConnection) => void,
  ) {
    this.keepAliveHeader = `Connection: keep-alive\r\nKeep-Alive: timeout=${Math.floor(o.keepAliveTimeoutMs / 1000)}\r\n`;
    this.clientIp = plainIp(socket.remoteAddress);
    this.#idleSince = o.clock.now();
    socket.setNoDelay(true);
    socket.on('data', this.#onData);
    socket.on('end', this.#onEnd);
    socket.on('error', this.#onError);
    socket.on('close', this.#onClose);
  }

  /**
   * Called about once a second (no timer per socket, re-armed on every read and write): close the
   * connection when no response was in flight for the keep-alive timeout (a head that stopped
   * half-way included).
   */
  sweep(now: number): void {
    if (this.#res === null && now - this.#idleSince > this.o.keepAliveTimeoutMs) {
      this.#release();
      this.socket.destroy();
    }
  }

  /** Shutting down: close now if idle, else after the response in flight. */
  drain(): void {
    if (this.#res !== null) this.#res.keepAlive = false;
    else this.socket.destroy();
  }

  /** The response in flight has been written whole. */
  responseDone(res: RawResponse): void {
    if (this.#res !== res) return;
    this.#res = null;
    this.#idleSince = this.o.clock.now();
    if (!res.keepAlive) {
      this.#release();
      this.socket.end();
      return;
    }
    if (this.socket.isPaused()) this.socket.resume();
    // Pipelined requests: the next one on a later tick, so answers given synchronously (404, 429…)
    // do not recurse once per request waiting in the buffer.
    if (this.#buf.length > 0) process.nextTick(this.#onPipelined);
  }

  #data(chunk: Buffer): void {
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    if (this.#res !== null) {
      // Pipelined while we answer: keep it, but stop reading once a lot is waiting.
      if (this.#buf.length > this.o.maxHeaderSize + MAX_BUFFERED_BODY) this.socket.pause();
      return;
    }
    this.#next();
  }

  /** Take the next request from the buffer, if a whole one is there. */
  #next(): void {
    const buf = this.#buf;
    const r = parseRequestHead(buf, 0, this.o.maxHeaderSize);
    if (r.kind === 'incomplete') {
      // A head dripping in slowly, or a large one in many pieces (each piece re-joins and
      // re-scans the buffer here), goes to Node's incremental parser and its headersTimeout.
      if (this.#headStarted === -1) this.#headStarted = this.o.clock.now();
      else if (buf.length > PARTIAL_HEAD_LIMIT || this.o.clock.now() - this.#headStarted > this.o.headersTimeoutMs) this.#handover();
      return;
    }
    // Anything our stricter parser refuses, Node's server answers (400, 431…) as it always has.
    if (r.kind === 'error') {
      this.#handover();
      return;
    }
    const head = r.head;
    const length = head.contentLength > 0 ? head.contentLength : 0;
    if (
      head.minor !== 1 ||
      head.transferEncoding ||
      head.expect ||
      head.upgrade ||
      length > MAX_BUFFERED_BODY ||
      !head.target.startsWith(SERVICES_PATH) ||
      this.o.closing()
    ) {
      this.#handover();
      return;
    }
    if (buf.length < head.size + length) {
      // The body is still coming: Node's server streams it (and may answer before it is all here).
      this.#handover();
      return;
    }
    this.#headStarted = -1;
    const body = length === 0 ? EMPTY : Buffer.from(buf.subarray(head.size, head.size + length));
    const rest = head.size + length;
    this.#buf = rest === buf.length ? EMPTY : buf.subarray(rest);
    const res = new RawResponse(this, this.socket, head.method === 'HEAD', head.keepAlive);
    this.#res = res;
    this.#idleSince = -1;
    this.o.serve(new RawRequest(head, body), res, this.clientIp);
  }

  #handover(): void {
    const pending = this.#buf.length > 0 ? this.#buf : null;
    this.#buf = EMPTY;
    this.#release(true);
    this.o.handover(this.socket, pending);
  }

  #ended(): void {
    // The client is done sending: finish what is in flight, then close.
    if (this.#res !== null) this.#res.keepAlive = false;
    else {
      this.#release();
      this.socket.end();
    }
  }

  #closed(): void {
    const res = this.#res;
    this.#res = null;
    this.#release();
    res?.socketClosed();
  }

  /** Stop listening: the socket is closing, or belongs to Node's server now (`handover`). */
  #release(handover = false): void {
    if (this.#gone) return;
    this.#gone = true;
    const s = this.socket;
    s.off('data', this.#onData);
    s.off('end', this.#onEnd);
    s.off('close', this.#onClose);
    if (handover) s.off('error', this.#onError); // Node's server listens from now on
    this.onGone(this);
  }
}
