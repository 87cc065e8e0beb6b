// The promise form of Http1Pool.dispatch, for tests: resolves at the response head with the
// body as a Readable that reads from the replica only as fast as it is consumed.

import { Readable } from 'node:stream';
import {
  headerObject,
  Http1Error,
  withErrorPath,
  type Http1Exchange,
  type Http1Handler,
  type Http1Pool,
  type Http1Request,
} from '../../src/http1/index.js';

export interface Http1Response {
  status: number;
  statusText: string;
  /** `[name, value, …]` as the replica sent them. */
  rawHeaders: string[];
  /** Lower-case names; repeated headers joined with ', ' (set-cookie kept as a list). */
  headers: Record<string, string | string[]>;
  /** Consume or destroy it; destroying it closes the connection. */
  body: Readable;
}

export interface Http1RequestOptions extends Http1Request {
  /** Aborts the request (before or during the response). */
  signal?: AbortSignal;
}

export function request(pool: Http1Pool, o: Http1RequestOptions): Promise<Http1Response> {
  return new Promise((resolve, reject) => {
    const signal = o.signal;
    if (signal?.aborted) return reject(abortError(signal));
    const h = new StreamHandler(resolve, reject);
    const ex = pool.dispatch(o, h);
    h.exchange = ex;
    if (signal) {
      const onAbort = (): void => ex.abort(abortError(signal));
      signal.addEventListener('abort', onAbort, { once: true });
      h.cleanup = () => signal.removeEventListener('abort', onAbort);
    }
  });
}

function abortError(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new Http1Error('DP_HTTP1_ABORTED', 'the request was aborted');
}

class StreamHandler implements Http1Handler {
  exchange: Http1Exchange | null = null;
  cleanup: (() => void) | null = null;
  #body: Readable | null = null;

  constructor(
    private readonly resolve: (r: Http1Response) => void,
    private readonly reject: (err: Error) => void,
  ) {}

  onResponseStart(status: number, statusText: string, rawHeaders: string[]): void {
    // Destroyed with the replica's failure, perhaps before the caller has begun to read it.
    const body = withErrorPath(
      new Readable({
        read: () => this.exchange?.resume(),
        destroy: (err, cb) => {
          this.exchange?.abort(err ?? new Http1Error('DP_HTTP1_ABORTED', 'the response body was destroyed'));
          cb(err);
        },
      }),
    );
    this.#body = body;
    this.resolve({ status, statusText, rawHeaders, headers: headerObject(rawHeaders), body });
  }

  onResponseData(chunk: Buffer): boolean {
    return this.#body!.push(chunk);
  }

  onResponseEnd(): void {
    this.cleanup?.();
    // The exchange is over: the stream's auto-destroy after 'end' has nothing to abort (and
    // must not build an Error with a stack per response).
    this.exchange = null;
    this.#body!.push(null);
  }

  onResponseError(err: Error): void {
    this.cleanup?.();
    if (this.#body === null) this.reject(err);
    else if (!this.#body.destroyed) this.#body.destroy(err);
  }
}
