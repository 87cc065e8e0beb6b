// One connection from Nginx to a balancer socket, relayed request by request: each
// request head is read strictly, the request goes to the replica Replicas.dispatch() chooses for
// it (least outstanding requests, on that replica's keep-alive pool), and the answer comes back
// framed by us. Nginx keeps these connections open and reuses them, so the choice must be per
// request: a connection pinned to one replica would hold all its requests there.
//
// - Requests on one connection are answered in order; bytes of the next one wait in the buffer.
// - A request body that came whole with its head is sent as a Buffer (the request may then be
//   retried on another replica); any other body is streamed from the socket with backpressure,
//   a chunked one decoded here (the pool frames it again).
// - The answer: the replica's headers without its framing, our Content-Length or chunked coding,
//   the head written with the first body bytes where that is one write.
// - Failures before the answer's head → the catalog's `{detail}` answer; after it → the socket is
//   destroyed, so Nginx sees a truncated upstream response rather than a wrong one. The client
//   hanging up aborts the exchange (the replica's connection is closed).
// - An Upgrade is not HTTP any more after its answer: the connection is pinned to one replica
//   (Replicas.open) and spliced until either side closes.
// - On the shared socket (serviceKey null) each request names its service in SERVICE_HEADER,
//   which Nginx sets and the replica never sees; on a service's own socket the socket names it.
//   Our default server names none (BY_HOST): the request's Host picks the service by its
//   by-host route, and a host without one is sent back to Nginx's 404 (X-Accel-Redirect). So
//   is a request of a site Nginx still has for a service that has left the document (its host
//   now unknown): a removal takes effect at once, not at the reload that drops the site.
//   What the host's site would do beyond the relay is done here (host-auth.ts): an `auth: true`
//   service's token is checked with the control server while the connection waits (its later
//   requests and any body stay buffered), a model's preflight is answered and its CORS added.

import type { Socket } from 'node:net';
import { Readable } from 'node:stream';
import { ChunkedDecoder, type ChunkedSink } from '../http1/chunked.js';
import { sameLower } from '../http1/field.js';
import { DEFAULT_MAX_HEADER_SIZE, type Http1Exchange, type Http1Handler } from '../http1/index.js';
import { parseRequestHead, type RequestHead } from '../http1/request-head.js';
import { detailResponse } from './detail.js';
import { DataPlaneError, statusFor } from './errors.js';
import type { Replicas } from './replicas.js';
import { checkAnswer, CORS_LINES, preflightAnswer, refusalAnswer, type HostAuthorize, type HostDecision } from './host-auth.js';
import { AUTH_CHECK_PREFIX, BY_HOST, MODEL_API, SERVICE_HEADER, UNKNOWN_HOST_LOCATION } from './service-header.js';
import { splice } from './splice.js';

/** What a relayed connection reports to its balancer. */
export interface RelayStats {
  /** Requests relayed (pinned connections counted once). */
  requests: number;
  /** Requests answered by us because no replica could take them (503, or every replica failed). */
  unavailable: number;
}

const EMPTY = Buffer.alloc(0);
/** A small body piece is sent in the same write as the head or its chunk size (one string, one syscall). */
const JOIN_LIMIT = 16 * 1024;
/** Bytes of later requests buffered while one is answered, before reading stops. */
const PENDING_LIMIT = DEFAULT_MAX_HEADER_SIZE + 64 * 1024;
/** A streamed request body buffers this much before reading from the client stops. */
const BODY_HIGH_WATER = 64 * 1024;
/** How long a closing connection waits, its answer flushed, for the client to hang up. */
const LINGER_MS = 2_000;
const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n';

/**
 * Takes over a connection whose first request is for the model API: `head` holds the bytes read
 * from it so far (that request's head, maybe some of its body), to be read again first.
 */
export type ModelApiHandOff = (socket: Socket, head: Buffer) => void;

export class RelayConnection {
  /** Bytes read and not yet taken (a partial head, later requests). */
  #buf: Buffer = EMPTY;
  /** The request being answered. */
  #req: RelayRequest | null = null;
  /** Its body, while still arriving from the socket. */
  #body: RequestBody | null = null;
  /** No further request is read: the connection is closing, closed, or pinned. */
  #done = false;
  /** A by-host token check waits for the control server's word: the request and later ones wait. */
  #checking = false;
  /** The service whose token check the request at the head of the buffer has passed. */
  #passed: string | null = null;
  /** Another process serves new connections: the next request here is the last. */
  #draining = false;
  /** No request has been taken from this connection yet. */
  #first = true;
  #waitingDrain = false;
  readonly #onData = (chunk: Buffer): void => this.#data(chunk);
  readonly #onEnd = (): void => this.#clientEnded();
  readonly #onClose = (): void => this.#closed();
  readonly #onDrain = (): void => {
    this.#waitingDrain = false;
    this.#req?.exchange?.resume();
  };
  readonly #onNext = (): void => {
    if (this.#req === null && !this.#checking && !this.#done) this.#next();
  };

  /**
   * `serviceKey`: the service of every request on this connection; null on the shared socket,
   * where each request names its own.
   */
  constructor(
    readonly serviceKey: string | null,
    readonly socket: Socket,
    private readonly replicas: Replicas,
    private readonly stats: RelayStats,
    private readonly hostAuth?: HostAuthorize,
    private readonly modelApi?: ModelApiHandOff,
  ) {
    socket.on('data', this.#onData);
    socket.on('end', this.#onEnd);
    socket.on('close', this.#onClose);
    socket.resume();
  }

  /**
   * Another process serves the data plane now: each request read from here on is answered with
   * Connection: close, and the connection ends with it. One already answered with keep-alive
   * keeps it (its peer may reuse the connection); the next one is the last.
   */
  drain(): void {
    this.#draining = true;
  }

  /** The request body still being read (its answer cannot keep the connection). */
  get readingBody(): boolean {
    return this.#body !== null;
  }

  #data(chunk: Buffer): void {
    if (this.#done) return;
    const body = this.#body;
    if (body !== null) {
      const used = body.feed(chunk, 0);
      if (used === -1) return this.#badBody(body);
      if (body.complete) this.#body = null;
      if (used === chunk.length) return;
      chunk = chunk.subarray(used);
    }
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    if (this.#req !== null || this.#checking) {
      if (this.#buf.length > PENDING_LIMIT) this.socket.pause();
      return;
    }
    this.#next();
  }

  /** Take the next request from the buffer, if its head is all there. */
  #next(): void {
    const buf = this.#buf;
    const r = parseRequestHead(buf, 0, DEFAULT_MAX_HEADER_SIZE);
    if (r.kind === 'incomplete') return;
    if (r.kind === 'error') {
      const a = statusFor(new DataPlaneError('DP_ERR_BAD_REQUEST', r.reason), this.serviceKey ?? '');
      return this.#close(detailResponse(r.status, a.detail, false));
    }
    const head = r.head;
    const first = this.#first;
    this.#first = false;
    if (this.#draining) head.keepAlive = false;
    let service = this.serviceKey;
    /** A by-host request for a service whose site adds CORS: ours replace the replica's. */
    let cors = false;
    if (service === null) {
      service = takeService(head.rawHeaders);
      if (service === null) {
        // Only a site without our proxy_set_header (or something else on the socket) sends this:
        // nothing is relayed, and the body's end is not looked for.
        const a = statusFor(new DataPlaneError('DP_ERR_BAD_REQUEST', SERVICE_HEADER_PROBLEM), '');
        return this.#close(detailResponse(a.status, a.detail, false));
      }
      if (service.startsWith(AUTH_CHECK_PREFIX)) return this.#authCheck(head, service.slice(AUTH_CHECK_PREFIX.length));
      if (service === MODEL_API) return this.#toModelApi(first);
      if (service === BY_HOST) {
        const routed = this.replicas.routeForHost(hostOf(head.rawHeaders));
        if (routed === undefined) return this.#unknownHost(head);
        service = routed.serviceKey;
        const { route } = routed;
        if (route.cors && head.method === 'OPTIONS') return this.#answerHere(head, preflightAnswer(true), preflightAnswer(false));
        if (route.auth) {
          // Checked for this service, or checked now (the route may have changed meanwhile).
          if (this.#passed !== service) return this.#checkToken(head, service, route.cors);
          this.#passed = null;
          takeHeader(head.rawHeaders, 'authorization');
        }
        cors = route.cors;
      }
    }
    if (this.replicas.hasLeft(service)) {
      // A site Nginx has not dropped yet names a service that has left the document.
      service = this.replicas.successorOf(service, hostOf(head.rawHeaders));
      if (service === null) return this.#unknownHost(head);
    }
    if (head.upgrade) return this.#pin(service, head);
    this.stats.requests++;

    let body: Buffer | RequestBody | null = null;
    let end = head.size;
    const length = head.contentLength;
    if (head.transferEncoding || length > 0) {
      const avail = buf.length - head.size;
      if (!head.transferEncoding && avail >= length) {
        body = buf.subarray(head.size, head.size + length);
        end += length;
      } else {
        const rb = new RequestBody(this, head.transferEncoding ? -1 : length);
        body = rb;
        if (avail > 0) {
          end = rb.feed(buf, head.size);
          if (end === -1) {
            const a = statusFor(new DataPlaneError('DP_ERR_BAD_REQUEST', `invalid chunked body: ${rb.error}`), service);
            return this.#close(detailResponse(a.status, a.detail, false));
          }
        }
        if (!rb.complete) {
          this.#body = rb;
          // The client waits for this before sending its body; we have taken the Expect off.
          if (head.expect && head.minor === 1) this.socket.write(CONTINUE, 'latin1');
        }
      }
    }
    this.#buf = end === buf.length ? EMPTY : buf.subarray(end);
    const req = new RelayRequest(this, head, service, cors);
    this.#req = req;
    req.exchange = this.replicas.dispatch(
      service,
      { method: head.method, path: head.target, headers: forwardHeaders(head.rawHeaders), body, validated: true },
      req,
    );
  }

  /**
   * A request for the gateway's model API: the connection, with every byte read so far, goes to
   * the API's HTTP server, and nothing here reads from it again. An entrypoint site opens a
   * connection per request, so this is its first; on a connection that carried others (not a
   * site of ours) it is refused.
   */
  #toModelApi(first: boolean): void {
    const handOff = this.modelApi;
    if (!first) return this.#close(detailResponse(400, 'the model API takes a connection of its own', false));
    if (handOff === undefined) return this.#close(detailResponse(503, 'the model API is not served on this socket', false));
    this.#done = true;
    const s = this.socket;
    s.pause();
    s.off('data', this.#onData);
    s.off('end', this.#onEnd);
    s.off('close', this.#onClose);
    const bytes = this.#buf;
    this.#buf = EMPTY;
    handOff(s, bytes);
  }

  /**
   * A site's token check (its auth_request): answered with the control server's word once it
   * comes; the connection reads nothing more meanwhile. A check has no body: one that says
   * otherwise is answered and the connection closed.
   */
  #authCheck(head: RequestHead, project: string): void {
    const authorize = this.hostAuth;
    const answer = (d: HostDecision): void => this.#answerHere(head, checkAnswer(d, true), checkAnswer(d, false));
    if (authorize === undefined) return answer('unavailable');
    this.#checking = true;
    const done = (d: HostDecision): void => {
      this.#checking = false;
      if (this.#done) return;
      answer(d);
      if (this.socket.isPaused() && !this.#done) this.socket.resume();
    };
    void authorize(project, headerValue(head.rawHeaders, 'authorization')).then(done, () => done('unavailable'));
  }

  /**
   * The token check of a by-host request for an `auth: true` service. The request stays in the
   * buffer, and the connection reads nothing more, until the control server answers: a pass
   * takes the request again from its head, a refusal answers it as the site would.
   */
  #checkToken(head: RequestHead, service: string, cors: boolean): void {
    const project = service.slice(0, service.indexOf('/'));
    const authorize = this.hostAuth;
    if (authorize === undefined) return this.#refuse(head, 'unavailable', project, cors);
    this.#checking = true;
    void authorize(project, headerValue(head.rawHeaders, 'authorization')).then(
      (decision) => this.#checked(head, decision, service, project, cors),
      () => this.#checked(head, 'unavailable', service, project, cors),
    );
  }

  #checked(head: RequestHead, decision: HostDecision, service: string, project: string, cors: boolean): void {
    this.#checking = false;
    if (this.#done) return;
    if (decision === 'allow') {
      this.#passed = service;
      this.#next();
    } else this.#refuse(head, decision, project, cors);
    // Paused while the check held more than a request's worth: read on, into the body if one streams.
    if (this.socket.isPaused() && !this.#done && (this.#req === null || this.#body !== null)) this.socket.resume();
  }

  #refuse(head: RequestHead, decision: Exclude<HostDecision, 'allow'>, project: string, cors: boolean): void {
    this.#answerHere(head, refusalAnswer(decision, project, cors, true), refusalAnswer(decision, project, cors, false));
  }

  /**
   * A by-host request for a host without a route: Nginx answers it as it answers unknown hosts.
   */
  #unknownHost(head: RequestHead): void {
    this.#answerHere(head, UNKNOWN_HOST, UNKNOWN_HOST_CLOSE);
  }

  /**
   * A request answered here, no replica asked. A request with a body closes the connection (its
   * body is not read: `closing`), as does one that asked to; otherwise the next request on the
   * connection is read as usual.
   */
  #answerHere(head: RequestHead, answer: string, closing: string): void {
    if (head.transferEncoding || head.contentLength > 0 || head.upgrade || !head.keepAlive) return this.#close(closing);
    this.#buf = head.size === this.#buf.length ? EMPTY : this.#buf.subarray(head.size);
    this.socket.write(answer, 'latin1');
    if (this.#buf.length > 0) process.nextTick(this.#onNext);
  }

  /** The answer's body could not be written at once: reading from the replica waits for 'drain'. */
  waitDrain(): void {
    if (this.#waitingDrain) return;
    this.#waitingDrain = true;
    this.socket.once('drain', this.#onDrain);
  }

  /** The bytes past the head are not a chunked body we can read: the request fails with a 400. */
  #badBody(body: RequestBody): void {
    this.#body = null;
    const err = new DataPlaneError('DP_ERR_BAD_REQUEST', `invalid chunked body: ${body.error}`);
    const req = this.#req;
    if (req !== null) {
      req.keepAlive = false; // where the body ends is unknown: nothing after it can be read
      req.exchange?.abort(err);
    }
    // Without an error: a body still queued for a connection has no 'error' listener yet.
    body.destroy();
  }

  /** The request's answer was written whole. */
  requestDone(req: RelayRequest): void {
    if (this.#req !== req) return;
    this.#req = null;
    // Draining or not, an answer that said keep-alive keeps the connection: Nginx may already
    // be sending the next request on it, which then gets Connection: close (drain()).
    if (!req.keepAlive) return this.#close('');
    if (this.socket.isPaused()) this.socket.resume();
    // The next one on a later tick: answers given at once (no replica) do not recurse per request.
    if (this.#buf.length > 0) process.nextTick(this.#onNext);
  }

  /** The request failed before its answer's head (`started` false) or inside its body. */
  requestFailed(req: RelayRequest, err: Error, started: boolean): void {
    if (this.#req !== req) return;
    const body = this.#body;
    if (body !== null) {
      this.#body = null;
      body.destroy();
    }
    if (started) {
      this.#req = null;
      this.#done = true;
      this.socket.destroy();
      return;
    }
    const a = statusFor(err, req.serviceKey);
    if (a.status === 499) {
      this.#req = null;
      this.#done = true;
      this.socket.destroy();
      return;
    }
    if (a.code !== 'DP_ERR_BAD_REQUEST') this.stats.unavailable++;
    // An unread body would be taken for the next request: then the connection closes.
    req.keepAlive &&= body === null;
    this.socket.write(detailResponse(a.status, a.detail, req.keepAlive), 'latin1');
    this.requestDone(req);
  }

  /** Write `last` (if any), end the connection and stop reading. */
  #close(last: string): void {
    if (this.#done) return;
    this.#done = true;
    this.#buf = EMPTY;
    const body = this.#body;
    this.#body = null;
    body?.destroy();
    const s = this.socket;
    if (s.destroyed) return;
    // Whatever the client still sends is read and dropped, so it cannot stall the answer.
    if (s.isPaused()) s.resume();
    if (last !== '') s.write(last, 'latin1');
    s.end(() => setTimeout(() => s.destroy(), LINGER_MS).unref());
  }

  /**
   * An Upgrade: this connection goes to one replica, the head and all that follows spliced
   * through. On the shared socket the head is written again without the service header.
   */
  #pin(service: string, head: RequestHead): void {
    this.#done = true;
    this.stats.requests++;
    const buf = this.#buf;
    const pending = this.serviceKey === null ? Buffer.concat([Buffer.from(headText(head), 'latin1'), buf.subarray(head.size)]) : buf;
    this.#buf = EMPTY;
    const s = this.socket;
    s.off('data', this.#onData);
    s.off('end', this.#onEnd);
    s.off('close', this.#onClose);
    s.pause();
    this.replicas.open(service).then(
      (up) => {
        if (s.destroyed) return void up.destroy();
        if (pending.length > 0) up.write(pending);
        splice(s, up);
        s.resume();
      },
      (err: unknown) => {
        this.stats.unavailable++;
        const a = statusFor(err, service);
        if (s.destroyed) return;
        s.resume(); // read and drop what the client sends
        s.end(detailResponse(a.status, a.detail, false), () => setTimeout(() => s.destroy(), LINGER_MS).unref());
      },
    );
  }

  #clientEnded(): void {
    if (this.#req === null) return this.#close('');
    // Nginx never half-closes a connection it still wants an answer on: its EOF means the client
    // went away (and a body cut short could not complete anyway). The exchange stops, and with
    // it the replica's work.
    this.socket.destroy();
  }

  #closed(): void {
    this.#done = true;
    const req = this.#req;
    this.#req = null;
    const body = this.#body;
    this.#body = null;
    body?.destroy();
    // The replica's connection is closed too (never reused half-read): it sees the client leave.
    req?.exchange?.abort(new DataPlaneError('DP_ERR_CLIENT_CLOSED'));
  }
}

/** One request's answer, relayed as the replica's pool delivers it. */
class RelayRequest implements Http1Handler {
  exchange: Http1Exchange | null = null;
  keepAlive: boolean;
  /** The answer's head, held back to go out with its first body bytes. */
  #head: string | null = null;
  #started = false;
  #chunked = false;
  #finished = false;
  readonly #isHead: boolean;
  readonly #http11: boolean;

  constructor(
    private readonly conn: RelayConnection,
    head: RequestHead,
    readonly serviceKey: string,
    /** A model's by-host request: the site's CORS headers replace the replica's. */
    private readonly cors: boolean,
  ) {
    this.keepAlive = head.keepAlive;
    this.#isHead = head.method === 'HEAD';
    this.#http11 = head.minor === 1;
  }

  onResponseStart(status: number, statusText: string, headers: string[], contentLength: number): void {
    if (this.#finished) return;
    this.#started = true;
    // The replica answered before the whole request body arrived: what is left of it is not read.
    if (this.conn.readingBody) this.keepAlive = false;
    let h = `HTTP/1.1 ${status} ${statusText}\r\n`;
    for (let i = 0; i < headers.length; i += 2) {
      const name = headers[i]!;
      const n = name.length;
      // The replica's framing and connection handling are its own; ours follow.
      if (n === 14 && sameLower(name, 0, 'content-length')) continue;
      if (n === 17 && sameLower(name, 0, 'transfer-encoding')) continue;
      if (n === 10 && (sameLower(name, 0, 'connection') || sameLower(name, 0, 'keep-alive'))) continue;
      if (this.cors && isCorsHeader(name)) continue;
      h += `${name}: ${headers[i + 1]!}\r\n`;
    }
    if (this.cors) h += CORS_LINES;
    if (this.#isHead || status === 204 || status === 304) {
      if (this.#isHead && contentLength >= 0) h += `Content-Length: ${contentLength}\r\n`;
    } else if (contentLength >= 0) h += `Content-Length: ${contentLength}\r\n`;
    else if (this.#http11) {
      this.#chunked = true;
      h += 'Transfer-Encoding: chunked\r\n';
    } else this.keepAlive = false; // HTTP/1.0 has no chunked coding: the body ends with the connection
    if (!this.keepAlive) h += 'Connection: close\r\n';
    else if (!this.#http11) h += 'Connection: keep-alive\r\n'; // HTTP/1.0 closes unless told
    this.#head = `${h}\r\n`;
    // Held for the first body bytes when they come in the same read; a replica that sends its
    // head and then thinks (an event stream's first event, a queued generation) must not keep
    // the client from seeing the status meanwhile.
    holdHead(this);
  }

  /** The head, if no body bytes took it along. */
  flushHead(): void {
    const head = this.#head;
    if (head === null || this.#finished) return;
    this.#head = null;
    const s = this.conn.socket;
    if (!s.destroyed && !s.write(head, 'latin1')) this.conn.waitDrain();
  }

  onResponseData(chunk: Buffer, _last: boolean): boolean {
    if (this.#finished) return true;
    const s = this.conn.socket;
    if (s.destroyed) return true;
    const n = chunk.length;
    if (n === 0) return true; // in chunked coding an empty chunk would end the body
    const head = this.#head;
    this.#head = null;
    let ok: boolean;
    if (this.#chunked) {
      const size = `${head ?? ''}${n.toString(16)}\r\n`;
      if (n <= JOIN_LIMIT) ok = s.write(`${size}${chunk.toString('latin1')}\r\n`, 'latin1');
      else {
        s.cork();
        s.write(size, 'latin1');
        s.write(chunk);
        ok = s.write('\r\n', 'latin1');
        s.uncork();
      }
    } else if (head === null) ok = s.write(chunk);
    else if (n <= JOIN_LIMIT) ok = s.write(head + chunk.toString('latin1'), 'latin1');
    else {
      s.cork();
      s.write(head, 'latin1');
      ok = s.write(chunk);
      s.uncork();
    }
    if (!ok) this.conn.waitDrain();
    return ok;
  }

  onResponseEnd(): void {
    if (this.#finished) return;
    this.#finished = true;
    const head = this.#head;
    this.#head = null;
    const tail = this.#chunked ? '0\r\n\r\n' : '';
    const s = this.conn.socket;
    if ((head !== null || tail !== '') && !s.destroyed) s.write(head === null ? tail : head + tail, 'latin1');
    this.conn.requestDone(this);
  }

  onResponseError(err: Error): void {
    if (this.#finished) return;
    this.#finished = true;
    this.conn.requestFailed(this, err, this.#started);
  }
}

/**
 * Heads held until the next tick. One read from an SSH connection carries the answers of many
 * requests: one tick flushes all the heads no body bytes took along, in the order they came.
 */
let held: RelayRequest[] = [];

function holdHead(req: RelayRequest): void {
  if (held.push(req) === 1) process.nextTick(flushHeld);
}

function flushHeld(): void {
  const reqs = held;
  held = [];
  for (const req of reqs) req.flushHead();
}

/**
 * A request body read from the client's socket as it arrives: `length` bytes, or (-1) a chunked
 * body decoded here. Pushing past the high-water mark pauses the socket; the pool's reading
 * resumes it.
 */
class RequestBody extends Readable implements ChunkedSink {
  /** The last byte arrived (the stream's end is pushed). */
  complete = false;
  #remaining: number;
  readonly #decoder: ChunkedDecoder | null;

  constructor(
    private readonly conn: RelayConnection,
    length: number,
  ) {
    super({ highWaterMark: BODY_HIGH_WATER });
    this.#remaining = length;
    this.#decoder = length === -1 ? new ChunkedDecoder(DEFAULT_MAX_HEADER_SIZE) : null;
  }

  get error(): string {
    return this.#decoder?.error ?? '';
  }

  /** Takes this body's bytes from `chunk[from…]`: the offset after them, or -1 (bad chunked framing). */
  feed(chunk: Buffer, from: number): number {
    const dec = this.#decoder;
    if (dec === null) {
      const take = Math.min(this.#remaining, chunk.length - from);
      this.#remaining -= take;
      this.onBody(from === 0 && take === chunk.length ? chunk : chunk.subarray(from, from + take), false);
      if (this.#remaining === 0) this.#finish();
      return from + take;
    }
    let i = from;
    while (i < chunk.length) {
      i = dec.execute(chunk, i, this);
      if (i === -1) return -1;
      if (dec.done) {
        this.#finish();
        break;
      }
    }
    return i;
  }

  onBody(piece: Buffer, _last: boolean): void {
    if (!this.push(piece)) this.conn.socket.pause();
  }

  override _read(): void {
    if (this.conn.readingBody && this.conn.socket.isPaused()) this.conn.socket.resume();
  }

  #finish(): void {
    this.complete = true;
    this.push(null);
  }
}

const NONE: readonly string[] = [];

/**
 * The request's headers without the hop-by-hop ones (RFC 9110 §7.6.1): Connection and the
 * headers it names, Keep-Alive, TE, Transfer-Encoding, Upgrade, Proxy-Connection, and Expect
 * (answered here). The request's own array when nothing is dropped, the common case.
 */
function forwardHeaders(raw: string[]): readonly string[] {
  let named: readonly string[] = NONE;
  let drop = -1;
  for (let i = 0; i < raw.length; i += 2) {
    if (isHopByHop(raw[i]!)) {
      drop = i;
      if (raw[i]!.length === 10 && sameLower(raw[i]!, 0, 'connection')) named = connectionNames(raw[i + 1]!, named);
    }
  }
  if (drop === -1) return raw;
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (isHopByHop(name) || (named.length > 0 && named.includes(name.toLowerCase()))) continue;
    out.push(name, raw[i + 1]!);
  }
  return out;
}

function isHopByHop(name: string): boolean {
  switch (name.length) {
    case 2:
      return sameLower(name, 0, 'te');
    case 6:
      return sameLower(name, 0, 'expect');
    case 7:
      return sameLower(name, 0, 'upgrade');
    case 10:
      return sameLower(name, 0, 'connection') || sameLower(name, 0, 'keep-alive');
    case 16:
      return sameLower(name, 0, 'proxy-connection');
    case 17:
      return sameLower(name, 0, 'transfer-encoding');
    default:
      return false;
  }
}

/** The header names a Connection value lists (lower case), beyond the tokens already dropped. */
function connectionNames(value: string, names: readonly string[]): readonly string[] {
  let out: string[] | null = null;
  for (const token of value.split(',')) {
    const t = token.trim().toLowerCase();
    if (t === '' || t === 'close' || t === 'keep-alive' || t === 'upgrade') continue;
    (out ??= [...names]).push(t);
  }
  return out ?? names;
}

const UNKNOWN_HOST = `HTTP/1.1 404 Not Found\r\nX-Accel-Redirect: ${UNKNOWN_HOST_LOCATION}\r\nContent-Length: 0\r\n\r\n`;
const UNKNOWN_HOST_CLOSE = `HTTP/1.1 404 Not Found\r\nX-Accel-Redirect: ${UNKNOWN_HOST_LOCATION}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`;

/** The CORS headers a model's site sets itself (the replica's are hidden there). */
function isCorsHeader(name: string): boolean {
  if (name.length === 27) return sameLower(name, 0, 'access-control-allow-origin');
  return name.length === 28 && (sameLower(name, 0, 'access-control-allow-methods') || sameLower(name, 0, 'access-control-allow-headers'));
}

/** Takes every header `lower` (a lower-case name) out of `raw` in place; the first one's value, or null. */
function takeHeader(raw: string[], lower: string): string | null {
  let value: string | null = null;
  let w = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === lower.length && sameLower(name, 0, lower)) {
      value ??= raw[i + 1]!;
      continue;
    }
    if (w !== i) {
      raw[w] = name;
      raw[w + 1] = raw[i + 1]!;
    }
    w += 2;
  }
  raw.length = w;
  return value;
}

/** The request's Host without a port, as Nginx's $host has it (lower case); '' without one. */
/** The first value of header `lower` (a lower-case name) in `raw`. */
function headerValue(raw: readonly string[], lower: string): string | undefined {
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === lower.length && sameLower(name, 0, lower)) return raw[i + 1];
  }
  return undefined;
}

function hostOf(raw: readonly string[]): string {
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && sameLower(name, 0, 'host')) {
      const value = raw[i + 1]!;
      const colon = value.indexOf(':');
      return (colon === -1 ? value : value.slice(0, colon)).toLowerCase();
    }
  }
  return '';
}

const SERVICE_HEADER_LOWER = SERVICE_HEADER.toLowerCase();
const SERVICE_HEADER_PROBLEM = `a request on the shared data-plane socket needs exactly one ${SERVICE_HEADER} header`;
/** `<project>/<run>` as the document's names allow them (src/spec/schema.ts): nothing else is looked up or echoed. */
const SERVICE_KEY = /^[A-Za-z0-9_-]{1,64}\/[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
/** A site's token check names the project: the first half of a service key. */
const AUTH_CHECK = new RegExp(`^${AUTH_CHECK_PREFIX}[A-Za-z0-9_-]{1,64}$`);

/**
 * The service a request on the shared socket names, its header taken out of `raw` in place (no
 * copy per request, and forwardHeaders then keeps its no-copy case); null when the header is
 * missing, repeated, or not a service key.
 */
function takeService(raw: string[]): string | null {
  let at = -1;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === SERVICE_HEADER_LOWER.length && sameLower(name, 0, SERVICE_HEADER_LOWER)) {
      if (at !== -1) return null;
      at = i;
    }
  }
  if (at === -1) return null;
  const value = raw[at + 1]!;
  raw.copyWithin(at, at + 2);
  raw.length -= 2;
  return value === BY_HOST || value === MODEL_API || SERVICE_KEY.test(value) || AUTH_CHECK.test(value) ? value : null;
}

/** A request head as text again, from its parsed parts (the header list as it is now). */
function headText(head: RequestHead): string {
  let t = `${head.method} ${head.target} HTTP/1.${head.minor}\r\n`;
  const raw = head.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) t += `${raw[i]!}: ${raw[i + 1]!}\r\n`;
  return `${t}\r\n`;
}
