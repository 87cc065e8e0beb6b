// One chat request on an Http1Pool or through the data plane, as the plugin wants the answer: a small non-streaming answer
// of known length whole, in one Buffer (sent to the client in one write with its length, with no
// stream plumbing: most answers without `stream` are a few KiB), anything else (an event stream,
// a large or unsized body) as a Readable that reads from the replica only as fast as the client
// takes it.

import { Readable } from 'node:stream';
import { headerObject, Http1Error, withErrorPath, type Http1Exchange, type Http1Handler, type Http1Request } from '../http1/index.js';
import type { ClientAbort, UpstreamResponse } from './types.js';

/** A non-streaming answer up to this size is read whole before the promise resolves. */
export const MAX_WHOLE_BODY = 64 * 1024; // 64 KiB

/** Sends a request: a pool's dispatch, or the data plane's for one service. */
export type Send = (req: Http1Request, handler: Http1Handler) => Http1Exchange;

/** Sends `req`; `signal` aborting (the client went away) closes the connection to the replica. */
export function exchange(send: Send, req: Http1Request, signal: ClientAbort): Promise<UpstreamResponse> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(aborted());
      return;
    }
    const h = new AnswerHandler(resolve, reject);
    const ex = send(req, h);
    h.exchange = ex;
    // The emitter lives as long as the request: no need to take the listener off. After the
    // answer is complete abort() does nothing.
    signal.once('abort', () => ex.abort(aborted()));
  });
}

function aborted(): Http1Error {
  return new Http1Error('DP_HTTP1_ABORTED', 'the client went away');
}

class AnswerHandler implements Http1Handler {
  exchange: Http1Exchange | null = null;
  #status = 0;
  #headers: Record<string, string | string[]> | null = null;
  /** Set when the answer streams; null while it is read whole. */
  #body: Readable | null = null;
  #parts: Buffer[] = [];
  #size = 0;
  #settled = false;

  constructor(
    private readonly resolve: (r: UpstreamResponse) => void,
    private readonly reject: (err: Error) => void,
  ) {}

  onResponseStart(status: number, _statusText: string, raw: string[], contentLength: number): void {
    const headers = headerObject(raw);
    const type = headers['content-type'];
    // The length the parser frames the body by (checked), not the replica's header.
    const whole =
      contentLength >= 0 && contentLength <= MAX_WHOLE_BODY && !(typeof type === 'string' && type.startsWith('text/event-stream'));
    if (whole) {
      this.#status = status;
      this.#headers = headers;
      return;
    }
    // Destroyed with the replica's failure, perhaps before the plugin has begun to read it.
    const body = withErrorPath(
      new Readable({
        read: () => this.exchange?.resume(),
        destroy: (err, cb) => {
          if (!this.#settled) this.exchange?.abort(err ?? new Http1Error('DP_HTTP1_ABORTED', 'the response body was destroyed'));
          cb(err);
        },
      }),
    );
    this.#body = body;
    this.resolve({ status, headers, body });
  }

  onResponseData(chunk: Buffer): boolean {
    if (this.#body !== null) return this.#body.push(chunk);
    this.#parts.push(chunk);
    this.#size += chunk.length;
    return true;
  }

  onResponseEnd(): void {
    this.#settled = true;
    if (this.#body !== null) {
      this.#body.push(null);
      return;
    }
    const parts = this.#parts;
    const body = parts.length === 1 ? parts[0]! : Buffer.concat(parts, this.#size);
    this.resolve({ status: this.#status, headers: this.#headers!, body });
  }

  onResponseError(err: Error): void {
    this.#settled = true;
    if (this.#body === null) this.reject(err);
    else if (!this.#body.destroyed) this.#body.destroy(err);
  }
}
