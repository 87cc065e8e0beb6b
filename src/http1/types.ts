// The upstream client's request, handler and error types, shared by the connection, the pool and
// the promise API.

import type { Readable } from 'node:stream';

export interface Http1Request {
  method: string;
  /** The request target as sent, e.g. `/v1/chat/completions?x=1`. */
  path: string;
  /**
   * `[name, value, …]`, sent in this order. Host belongs here (the pool's `host` is sent when it
   * is missing). Leave out Connection and Transfer-Encoding: framing is the client's business.
   */
  headers: readonly string[];
  /**
   * The method, target and headers already obey RFC 9110 syntax (they come from Node's HTTP
   * parser, like IncomingMessage.rawHeaders, plus constants): skip the check for CR/LF and other
   * bytes that would break the framing. Default false: checked, DP_HTTP1_BAD_REQUEST when bad.
   */
  validated?: boolean;
  /**
   * null / absent: no body. Buffer or string: sent with its Content-Length. Readable: streamed with
   * backpressure, with the Content-Length found in `headers` (the stream must match it), else chunked.
   */
  body?: Readable | Buffer | string | null;
}

/** One response, delivered as it arrives. Exactly one of onResponseEnd / onResponseError is called. */
export interface Http1Handler {
  /**
   * The final status and headers (1xx skipped), `[name, value, …]` as the replica sent them.
   * `contentLength`: the length the body is framed by, checked (exactly that many bytes follow or
   * the response fails), or -1 (chunked, until close, no body); for HEAD, the declared length.
   * A relay frames its own output from this, never from the replica's framing headers.
   */
  onResponseStart(status: number, statusText: string, headers: string[], contentLength: number): void;
  /**
   * A piece of the body; false pauses reading from the replica until the exchange's resume().
   * `last`: it completes a body of known length, onResponseEnd follows at once (a handler may
   * finish its own output with it).
   */
  onResponseData(chunk: Buffer, last: boolean): boolean;
  onResponseEnd(): void;
  /** After onResponseStart this means the body was cut short. */
  onResponseError(err: Error): void;
}

/** The caller's hold on a request in flight. */
export interface Http1Exchange {
  /** Stop it: the connection is closed (never reused half-read) and the handler gets `reason`. */
  abort(reason?: Error): void;
  /** Read again after onResponseData returned false. */
  resume(): void;
  /**
   * A pool's exchange: still waiting in its queue, no byte of it written (an abort now sends
   * nothing anywhere, so the request may go elsewhere). Absent: unknown.
   */
  readonly unsent?: boolean;
}

export type Http1ErrorCode =
  | 'DP_HTTP1_HEADERS_TIMEOUT' // no response head within headersTimeoutMs
  | 'DP_HTTP1_BODY_TIMEOUT' // the replica was silent longer than bodyTimeoutMs inside a body
  | 'DP_HTTP1_CLOSED' // the connection closed or failed before the response ended
  | 'DP_HTTP1_ABORTED' // the caller aborted, or the request body stream ended early
  | 'DP_HTTP1_BODY_LENGTH' // the request body stream did not match its Content-Length
  | 'DP_HTTP1_BAD_REQUEST' // a header name/value or the target would break the request framing
  | 'DP_HTTP1_POOL_CLOSED'; // the pool was destroyed

export class Http1Error extends Error {
  constructor(
    readonly code: Http1ErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'Http1Error';
  }
}
