// The document's rate limits, enforced in-process (dstack refuses them without a gateway).
// Same semantics as the gateway's `limit_req … burst=B nodelay`: per service, the limits of the
// longest matching prefix apply (as Nginx picks the longest prefix location), each with its own
// key (client address or a header); a key that is empty (header absent) is not limited.
// Each (service, limit, key value) is a token bucket of burst + 1 tokens refilled at rps.

import type { RateLimit, Service } from '../spec/types.js';

export interface RateLimiterOptions {
  clock?: { now(): number };
  /** Buckets kept at most; full ones are swept first, then the oldest. Default 100,000. */
  maxBuckets?: number;
}

interface Bucket {
  tokens: number;
  /** ms of the last refill. */
  at: number;
}

export interface RateRequest {
  /** The path relative to the service root ('/…', query excluded). */
  path: string;
  clientIp: string;
  header(name: string): string | undefined;
}

export class RateLimiter {
  readonly #clock: { now(): number };
  readonly #max: number;
  readonly #buckets = new Map<string, Bucket>();

  constructor(o: RateLimiterOptions = {}) {
    this.#clock = o.clock ?? { now: () => Date.now() };
    this.#max = o.maxBuckets ?? 100_000;
  }

  get size(): number {
    return this.#buckets.size;
  }

  /** True when the request may pass; consumes a token of every applicable limit. */
  allow(serviceKey: string, limits: readonly RateLimit[], req: RateRequest): boolean {
    const applicable = longestPrefix(limits, req.path);
    if (applicable.length === 0) return true;
    const now = this.#clock.now();
    let ok = true;
    for (const l of applicable) {
      const value = l.key.type === 'ipAddress' ? req.clientIp : req.header(l.key.header);
      if (!value) continue;
      const id = `${serviceKey}\0${l.prefix}\0${l.key.type === 'header' ? l.key.header : ''}\0${value}`;
      if (!this.#take(id, l, now)) ok = false;
    }
    return ok;
  }

  #take(id: string, l: RateLimit, now: number): boolean {
    const capacity = l.burst + 1;
    let b = this.#buckets.get(id);
    if (!b) {
      if (this.#buckets.size >= this.#max) this.#sweep(now, l);
      b = { tokens: capacity, at: now };
      this.#buckets.set(id, b);
    } else {
      b.tokens = Math.min(capacity, b.tokens + ((now - b.at) / 1000) * l.rps);
      b.at = now;
    }
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  /** Drop buckets idle long enough to be full again (approximated with the current limit's rate), else the oldest half. */
  #sweep(now: number, l: RateLimit): void {
    const refillMs = ((l.burst + 1) / l.rps) * 1000;
    for (const [id, b] of this.#buckets) if (now - b.at >= refillMs) this.#buckets.delete(id);
    if (this.#buckets.size < this.#max) return;
    let n = Math.ceil(this.#buckets.size / 2);
    for (const id of this.#buckets.keys()) {
      if (n-- <= 0) break;
      this.#buckets.delete(id);
    }
  }

  /** Forget the buckets of services no longer in the document. */
  retain(services: Iterable<Service>): void {
    const keep = new Set<string>();
    for (const s of services) keep.add(`${s.project}/${s.run}`);
    for (const id of this.#buckets.keys()) if (!keep.has(id.slice(0, id.indexOf('\0')))) this.#buckets.delete(id);
  }
}

/** The limits whose prefix is the longest one matching `path` (Nginx prefix-location choice). */
export function longestPrefix(limits: readonly RateLimit[], path: string): RateLimit[] {
  let best = -1;
  let out: RateLimit[] = [];
  for (const l of limits) {
    if (!path.startsWith(l.prefix)) continue;
    if (l.prefix.length > best) {
      best = l.prefix.length;
      out = [l];
    } else if (l.prefix.length === best) out.push(l);
  }
  return out;
}
