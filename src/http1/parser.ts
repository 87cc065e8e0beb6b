// An incremental HTTP/1.x response parser (RFC 9112) for the upstream client: bytes go in as they
// arrive, one head and the body's pieces come out. 1xx answers are skipped; the body is framed by
// Transfer-Encoding: chunked, Content-Length, or the end of the connection; HEAD, 204 and 304
// have none. Strict wherever leniency could desynchronise a reused connection or hand Node's
// ServerResponse a header it would throw on: any doubt is a ResponseParseError, and the caller
// closes the connection. Body pieces are subarrays of the input (no copy).

import { ChunkedDecoder } from './chunked.js';
import { fieldValue, sameLower } from './field.js';

export const DEFAULT_MAX_HEADER_SIZE = 64 * 1024; // 64 KiB: status line + headers, and trailers

/** The replica's bytes are not an HTTP/1.x response we can relay. */
export class ResponseParseError extends Error {
  readonly code = 'DP_HTTP1_BAD_RESPONSE';
  constructor(message: string) {
    super(message);
    this.name = 'ResponseParseError';
  }
}

/** Where the parser delivers one response. */
export interface ResponseSink {
  /**
   * Status line and headers ([name, value, …] as sent, values trimmed); 1xx never reach here.
   * `contentLength`: the body length this response is framed by — exactly that many bytes follow,
   * or the response fails — or -1 (chunked, until close, or no body). For a HEAD request, the
   * length the replica declared (-1 for none): it describes the body a GET would get.
   */
  onHead(status: number, statusText: string, headers: string[], contentLength: number): void;
  /** `last`: this piece completes a body of known length (onEnd follows at once). */
  onBody(chunk: Buffer, last: boolean): void;
  onEnd(): void;
}

// States (numbers, not an enum: cheap comparisons, nothing emitted).
const IDLE = 0; // no response expected: any byte is unsolicited
const HEAD = 1;
const LENGTH = 2;
const CHUNKED = 3; // chunked.ts decodes
const UNTIL_CLOSE = 4;
const DONE = 5;
const STOPPED = 6;

const EMPTY = Buffer.alloc(0);
const CRLFCRLF = Buffer.from('\r\n\r\n', 'latin1');

/** name ":" value CRLF, repeated: token names (RFC 9110 §5.6.2), values without CTLs but HTAB. */
const HEADER_BLOCK = /^(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*$/;
const REASON = /^[\t\x20-\x7e\x80-\xff]*$/;
const DIGITS = /^\d{1,15}$/;

export class ResponseParser {
  #state = IDLE;
  #sink: ResponseSink | null = null;
  #isHead = false;
  #maxHeaderSize: number;
  /** Head bytes of the current response not yet terminated by CRLFCRLF. */
  #parts: Buffer[] = [];
  #partsLen = 0;
  /** The last (up to) 3 bytes of #parts: a terminator may straddle them and the next chunk. */
  #tail: Buffer = EMPTY;
  #remaining = 0;
  readonly #chunked: ChunkedDecoder;
  #keepAlive = false;
  #received = false;
  // The final head, parsed and checked, handed to the sink once its first body bytes are checked too.
  #status = 0;
  #reason = '';
  #headers: string[] = [];
  #length = -1;

  constructor(maxHeaderSize = DEFAULT_MAX_HEADER_SIZE) {
    this.#maxHeaderSize = maxHeaderSize;
    this.#chunked = new ChunkedDecoder(maxHeaderSize);
  }

  /** Expect the response to a request; `isHead`: it was a HEAD (no body whatever the headers say). */
  start(sink: ResponseSink, isHead: boolean): void {
    if (this.#state !== IDLE && this.#state !== DONE) throw new Error('ResponseParser.start: a response is still being parsed');
    this.#state = HEAD;
    this.#sink = sink;
    this.#isHead = isHead;
    this.#keepAlive = false;
    this.#received = false;
    if (this.#parts.length > 0) this.#parts = [];
    this.#partsLen = 0;
    this.#tail = EMPTY;
  }

  /** The whole response arrived. */
  get done(): boolean {
    return this.#state === DONE;
  }

  /** A final (non-1xx) head arrived: the body phase. */
  get inBody(): boolean {
    return this.#state > HEAD && this.#state < DONE;
  }

  /** Any byte of the current response arrived (then a request may not be retried elsewhere). */
  get received(): boolean {
    return this.#received;
  }

  /** After done: the connection may carry another request. */
  get keepAlive(): boolean {
    return this.#keepAlive && this.#state === DONE;
  }

  /** Deliver nothing more (the exchange was aborted); the connection is not reusable. */
  stop(): void {
    this.#state = STOPPED;
    this.#sink = null;
  }

  /** Feed bytes. Null, or the error that makes the response (and the connection) unusable. */
  execute(chunk: Buffer): ResponseParseError | null {
    const n = chunk.length;
    if (n === 0) return null;
    if (this.#state === IDLE) return new ResponseParseError('bytes from the replica without a request');
    if (this.#state === STOPPED) return null;
    this.#received = true;
    let i = 0;
    while (i < n) {
      const state = this.#state;
      if (state === DONE) {
        // Bytes after a complete response: the connection is out of step, never reused.
        this.#keepAlive = false;
        return null;
      }
      const sink = this.#sink;
      if (sink === null) return null; // stopped from inside a callback
      if (state === LENGTH) {
        const take = Math.min(this.#remaining, n - i);
        // More than the replica declared: what follows would be taken for another response.
        if (take < n - i) return new ResponseParseError('the response body is longer than its Content-Length');
        this.#remaining -= take;
        const end = this.#remaining === 0;
        if (end) this.#state = DONE;
        sink.onBody(i === 0 && take === n ? chunk : chunk.subarray(i, i + take), end);
        i += take;
        if (end && this.#sink === sink) this.#end(sink);
      } else if (state === HEAD) {
        const r = this.#head(chunk, i);
        if (typeof r !== 'number') return r;
        i = r;
      } else if (state === CHUNKED) {
        const dec = this.#chunked;
        const r = dec.execute(chunk, i, sink);
        if (r === -1) return new ResponseParseError(dec.error);
        i = r;
        if (dec.done && this.#state === CHUNKED) {
          if (i < n) return new ResponseParseError('bytes after the end of a chunked body');
          this.#state = DONE;
          if (this.#sink === sink) this.#end(sink);
        }
      } else {
        // UNTIL_CLOSE
        sink.onBody(i === 0 ? chunk : chunk.subarray(i), false);
        i = n;
      }
    }
    return null;
  }

  /** The connection ended. Null when that completed the response (or none was expected). */
  finish(): ResponseParseError | null {
    const state = this.#state;
    if (state === IDLE || state === DONE || state === STOPPED) return null;
    if (state === UNTIL_CLOSE) {
      this.#state = DONE;
      this.#keepAlive = false;
      this.#end(this.#sink!);
      return null;
    }
    return new ResponseParseError(
      this.#received ? 'the replica closed the connection mid-response' : 'the replica closed the connection before answering',
    );
  }

  #end(sink: ResponseSink): void {
    this.#sink = null;
    sink.onEnd();
  }

  /** Head bytes from `from`: the offset after the head, or an error. */
  #head(chunk: Buffer, from: number): number | ResponseParseError {
    let end = -1; // exclusive end of CRLFCRLF in chunk
    if (this.#partsLen > 0) {
      // The terminator may straddle the previous part and this chunk.
      const t = this.#tail.length;
      const joint = Buffer.concat([this.#tail, chunk.subarray(from, from + 3)]);
      const j = joint.indexOf(CRLFCRLF);
      if (j !== -1) end = from + j + 4 - t;
    }
    if (end === -1) {
      const j = chunk.indexOf(CRLFCRLF, from);
      if (j !== -1) end = j + 4;
    }
    if (end === -1) {
      this.#partsLen += chunk.length - from;
      if (this.#partsLen > this.#maxHeaderSize) return new ResponseParseError(`response headers larger than ${this.#maxHeaderSize} bytes`);
      const part = from === 0 ? chunk : chunk.subarray(from);
      this.#parts.push(part);
      this.#tail = part.length >= 3 ? part.subarray(part.length - 3) : Buffer.concat([this.#tail, part]).subarray(-3);
      return chunk.length;
    }
    if (this.#partsLen + end - from > this.#maxHeaderSize)
      return new ResponseParseError(`response headers larger than ${this.#maxHeaderSize} bytes`);
    let text: string;
    if (this.#partsLen === 0) text = chunk.toString('latin1', from, end - 2);
    else {
      this.#parts.push(chunk.subarray(from, end));
      const all = Buffer.concat(this.#parts);
      text = all.toString('latin1', 0, all.length - 2);
      this.#parts = [];
      this.#partsLen = 0;
      this.#tail = EMPTY;
    }
    const err = this.#parseHead(text);
    if (err !== null) return err;
    const state = this.#state;
    if (state === HEAD) return end; // a 1xx, skipped
    // Bytes past a body's declared end in this very read: refused before anything is relayed.
    const extra = chunk.length - end;
    if (state === DONE && extra > 0) return new ResponseParseError('bytes after a response without a body');
    if (state === LENGTH && extra > this.#remaining) return new ResponseParseError('the response body is longer than its Content-Length');
    const sink = this.#sink!;
    sink.onHead(this.#status, this.#reason, this.#headers, this.#length);
    if (this.#state === DONE && this.#sink === sink) this.#end(sink);
    return end;
  }

  /** `text`: the status line and header lines, each ending in CRLF. */
  #parseHead(text: string): ResponseParseError | null {
    const eol = text.indexOf('\r\n');
    // "HTTP/1.x SSS[ reason]"
    if (eol < 12 || !text.startsWith('HTTP/1.') || text.charCodeAt(8) !== 32) return new ResponseParseError('malformed status line');
    const minor = text.charCodeAt(7) - 48;
    const s0 = text.charCodeAt(9) - 48;
    const s1 = text.charCodeAt(10) - 48;
    const s2 = text.charCodeAt(11) - 48;
    if ((minor !== 0 && minor !== 1) || !(s0 >= 1 && s0 <= 9) || !(s1 >= 0 && s1 <= 9) || !(s2 >= 0 && s2 <= 9))
      return new ResponseParseError('malformed status line');
    if (eol > 12 && text.charCodeAt(12) !== 32) return new ResponseParseError('malformed status line');
    const status = s0 * 100 + s1 * 10 + s2;
    const reason = eol > 13 ? text.slice(13, eol) : '';
    if (reason !== '' && !REASON.test(reason)) return new ResponseParseError('malformed status line');
    if (eol + 2 < text.length && !HEADER_BLOCK.test(text.slice(eol + 2))) return new ResponseParseError('malformed response header');

    const headers: string[] = [];
    let length = -1;
    let chunked = false;
    let te = false;
    let close = minor === 0;
    for (let p = eol + 2; p < text.length;) {
      const e = text.indexOf('\r\n', p);
      const colon = text.indexOf(':', p);
      const name = text.slice(p, colon);
      const value = fieldValue(text, colon, e);
      headers.push(name, value);
      p = e + 2;
      // Only the framing headers are looked at, compared without lower-casing (no string made).
      const len = name.length;
      if (len === 14 && sameLower(name, 0, 'content-length')) {
        if (!DIGITS.test(value)) return new ResponseParseError('invalid Content-Length');
        const v = Number(value);
        if (length !== -1 && length !== v) return new ResponseParseError('conflicting Content-Length headers');
        length = v;
      } else if (len === 17 && sameLower(name, 0, 'transfer-encoding')) {
        te = true;
        const lastComma = value.lastIndexOf(',');
        chunked = (lastComma === -1 ? value : value.slice(lastComma + 1)).trim().toLowerCase() === 'chunked';
      } else if (len === 10 && sameLower(name, 0, 'connection')) {
        if (value.length === 10 && sameLower(value, 0, 'keep-alive')) {
          if (minor === 0) close = false;
        } else if (value.length === 5 && sameLower(value, 0, 'close')) close = true;
        else {
          for (const token of value.toLowerCase().split(',')) {
            const t = token.trim();
            if (t === 'close') close = true;
            else if (t === 'keep-alive' && minor === 0) close = false;
          }
        }
      }
    }

    if (status < 200) {
      // 101 answers a request that asked to switch protocols; ours never do (upgrades have their own path).
      if (status === 101) return new ResponseParseError('unexpected 101 Switching Protocols');
      this.#state = HEAD; // 100 Continue, 103 Early Hints…: skipped, the final answer follows
      return null;
    }
    // Both framings at once is how responses get split (RFC 9112 §6.3): an error, never a guess.
    if (te && length !== -1) return new ResponseParseError('both Transfer-Encoding and Content-Length');
    this.#keepAlive = !close;
    this.#status = status;
    this.#reason = reason;
    this.#headers = headers;
    if (this.#isHead || status === 204 || status === 304) {
      this.#state = DONE;
      this.#length = this.#isHead ? length : -1;
      return null;
    }
    this.#length = te ? -1 : length;
    if (te) {
      if (chunked) {
        this.#state = CHUNKED;
        this.#chunked.reset();
      } else {
        this.#state = UNTIL_CLOSE;
        this.#keepAlive = false;
      }
    } else if (length > 0) {
      this.#state = LENGTH;
      this.#remaining = length;
    } else if (length === 0) {
      this.#state = DONE;
    } else {
      this.#state = UNTIL_CLOSE;
      this.#keepAlive = false;
    }
    return null;
  }
}
