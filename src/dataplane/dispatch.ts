// One request through the choice of Replicas: the exchange its caller holds and the handler the
// chosen replica's pool calls, moving the request to another replica when the rules allow.

import { canResend, type Http1Exchange, type Http1Handler, type Http1Request } from '../http1/index.js';
import { DataPlaneError } from './errors.js';
import { ConnectFailure, finalError, type Replica } from './replica.js';
import type { Replicas } from './replicas.js';

/** One request through the choice: the exchange its caller holds, and the handler its replica's pool calls. */
export class Dispatch implements Http1Exchange, Http1Handler {
  #replica: Replica | null = null;
  #tried: Set<Replica> | Replica | null = null;
  #inner: Http1Exchange | null = null;
  #started = false;
  #aborted: Error | null = null;
  #resent = false;
  #moving = false;
  #last: unknown = null;

  constructor(
    private readonly owner: Replicas,
    private readonly serviceKey: string,
    private readonly req: Http1Request,
    private readonly handler: Http1Handler,
  ) {}

  /** `first`: called from dispatch(), whose caller does not hold the exchange yet. */
  next(first = false): void {
    const r = this.owner.pick(this.serviceKey, this.#tried);
    if (r === null) {
      const err = finalError(this.serviceKey, this.#last);
      // A handler may use the exchange dispatch() returns: it hears of the failure after that
      // return, as a pool's handler does (an abort meanwhile is what it hears).
      if (first) process.nextTick(() => this.handler.onResponseError(this.#aborted ?? err));
      else this.handler.onResponseError(err);
      return;
    }
    if (this.#tried === null) this.#tried = r;
    else if (this.#tried instanceof Set) this.#tried.add(r);
    else this.#tried = new Set([this.#tried, r]);
    this.#replica = r;
    r.count();
    r.dispatched.add(this);
    this.#inner = r.pool.dispatch(this.req, this);
  }

  /** `r` left the rotation: if this request still waits in its pool, unsent, it is chosen for again. */
  moveOff(r: Replica): void {
    if (this.#replica !== r || this.#aborted !== null || this.#inner?.unsent !== true) return;
    this.#moving = true;
    this.#inner.abort(new Error('the replica left the rotation before the request was sent')); // → onResponseError
  }

  abort(reason?: Error): void {
    if (this.#aborted !== null) return;
    this.#aborted = reason ?? new DataPlaneError('DP_ERR_CLIENT_CLOSED');
    this.#inner?.abort(this.#aborted);
  }

  resume(): void {
    this.#inner?.resume();
  }

  onResponseStart(status: number, statusText: string, headers: string[], contentLength: number): void {
    this.#started = true;
    this.handler.onResponseStart(status, statusText, headers, contentLength);
  }

  onResponseData(chunk: Buffer, last: boolean): boolean {
    return this.handler.onResponseData(chunk, last);
  }

  onResponseEnd(): void {
    this.#release();
    this.handler.onResponseEnd();
  }

  onResponseError(err: Error): void {
    const r = this.#release();
    if (this.#moving) {
      this.#moving = false;
      if (this.#aborted === null) return this.next();
    }
    if (this.#aborted === null && !this.#started && r !== null) {
      if (err instanceof ConnectFailure) {
        this.#last = err;
        this.owner.logger?.warn(
          { service: this.serviceKey, replica: r.id, err: err.message },
          'opening an upstream failed; trying another replica',
        );
        return this.next();
      }
      if (!this.#resent && canResend(this.req) && (err as { code?: string }).code === 'DP_HTTP1_CLOSED') {
        this.#resent = true;
        this.#last = err;
        this.owner.logger?.warn(
          { service: this.serviceKey, replica: r.id, err: err.message },
          'the replica closed the connection before answering; sending the request to another replica',
        );
        return this.next();
      }
    }
    this.handler.onResponseError(this.#aborted ?? err);
  }

  #release(): Replica | null {
    const r = this.#replica;
    this.#replica = null;
    this.#inner = null;
    r?.dispatched.delete(this);
    r?.done();
    return r;
  }
}
