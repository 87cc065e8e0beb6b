// The replicas of every service and the per-request choice among them. The SSH loop says which
// replicas exist, how to reach each (an ssh2 channel, or TCP for `direct`) and whether it is
// Ready; everything that relays a request — the balancer sockets behind Nginx, the in-server
// proxy, the model API — asks here for a replica and sends on that replica's keep-alive pool.
//
// The choice is per request, not per connection: a Ready replica with the fewest requests in
// flight (least outstanding requests); among equals the one chosen longest ago, so requests one
// after another take turns exactly (a coin toss per request would split 100 of them 40:60 or
// worse one time in thirty) and a replica just added is the first to get one. A request counts from dispatch
// until its answer ended or failed, so a replica that answers slowly holds more and gets fewer
// new ones. Connections to a replica are pooled (src/http1), one pool per replica, so a choice
// costs no connect.
//
// Failures and retries, from the cheapest to the riskiest:
// - a connection to the chosen replica could not be opened: nothing was sent, so any request
//   goes to another Ready replica, until none is left;
// - the replica closed the connection before any byte of its answer: an idempotent request
//   whose body can be sent again (none, or a buffer) goes once more to another replica; anything
//   else fails (a POST may have been acted on; a streamed body is gone);
// - everything later (a head that breaks framing, a body cut short, a timeout) fails as it is.
//
// A removed replica gets no new request at once: those still queued in its pool (nothing of them
// written) are chosen for again among the others (503 when none is left); its requests in flight
// finish, for at most the drain period (drain()), then its connections close.

import { Socket as NetSocket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../clock.js';
import { Http1Pool, type Http1Exchange, type Http1Handler, type Http1Request } from '../http1/index.js';
import { Dispatch } from './dispatch.js';
import { sameRoute, type HostRoute } from './service-header.js';
import { ConnectFailure, errorText, finalError, Replica, type Tally, type Upstream } from './replica.js';

export type { Upstream } from './replica.js';

export interface ReplicasOptions {
  /** Opening a connection to a replica; past it that replica counts as failed. Default 10 s. */
  connectTimeoutMs?: number;
  /** Waiting for response headers, and silence inside a response body. Default 300 s; per service: setServiceOptions. */
  readTimeoutMs?: number;
  /** Idle keep-alive connections to a replica close after this. Default 4 s. */
  keepAliveTimeoutMs?: number;
  /** Connections per replica at most; more requests queue. Default 256. */
  connectionsPerReplica?: number;
  clock?: Clock;
  logger?: Logger;
}

/** What a service may set for itself, over the defaults of ReplicasOptions. */
export interface ServiceOptions {
  readTimeoutMs?: number;
}

export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000; // 10 s
export const DEFAULT_READ_TIMEOUT_MS = 300_000; // 300 s
export const DEFAULT_CONNECTIONS_PER_REPLICA = 256;

/** One replica's load, for status and metrics. */
export interface ReplicaLoad {
  service: string;
  replica: string;
  ready: boolean;
  /** Out of rotation, its requests still finishing. */
  draining: boolean;
  /** Requests (and pinned streams) in flight now. */
  inFlight: number;
  /** Requests and pinned streams sent to it since it was added. */
  requests: number;
  /**
   * Requests and pinned streams sent to this service's replica id, across its replacements: a
   * replica set again with the same id (a new address) continues the count of the one it
   * replaced, and the two entries of the id (the new one, the old one draining) show the same
   * total. It starts again from 0 only after the id left the books entirely (removed, drained).
   */
  total: number;
}

export class Replicas {
  readonly #services = new Map<string, Replica[]>();
  /** Every replica not yet idle after removal, by its upstream (drain() finds it there). */
  readonly #byUpstream = new Map<Upstream, Replica>();
  /** Per service and replica id on the books, its request count across replacements. */
  readonly #tallies = new Map<string, Tally>();
  readonly #clock: Clock;
  readonly #connectMs: number;
  readonly #readMs: number;
  readonly #keepAliveMs: number;
  readonly #perReplica: number;
  /** Read timeouts of the services that set their own. */
  readonly #serviceReadMs = new Map<string, number>();
  /** By-host routes: host → service and its route, and each routed service's route. */
  readonly #hostService = new Map<string, { serviceKey: string; route: HostRoute }>();
  readonly #serviceHost = new Map<string, HostRoute>();
  /** Services that left the document while a site may still name them: the hosts still claimed then. */
  readonly #left = new Map<string, ReadonlySet<string>>();
  readonly logger: Logger | undefined;

  constructor(o: ReplicasOptions = {}) {
    this.#clock = o.clock ?? systemClock;
    this.#connectMs = o.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    this.#readMs = o.readTimeoutMs ?? DEFAULT_READ_TIMEOUT_MS;
    this.#keepAliveMs = o.keepAliveTimeoutMs ?? 4_000;
    this.#perReplica = o.connectionsPerReplica ?? DEFAULT_CONNECTIONS_PER_REPLICA;
    this.logger = o.logger;
  }

  /**
   * Puts a replica in rotation (replacing one of the same id, which then drains). Set again with
   * the same upstream, it stays as it is: its pool, its connections and its counts.
   */
  set(serviceKey: string, id: string, upstream: Upstream): void {
    let list = this.#services.get(serviceKey);
    if (!list) this.#services.set(serviceKey, (list = []));
    const i = list.findIndex((r) => r.id === id);
    if (i !== -1 && list[i]!.upstream === upstream) return;
    const key = `${serviceKey}\0${id}`;
    let tally = this.#tallies.get(key);
    if (tally === undefined) this.#tallies.set(key, (tally = { total: 0, refs: 0 }));
    const r = new Replica(serviceKey, id, upstream, this, tally);
    const old = i === -1 ? undefined : list[i]!;
    if (i === -1) list.push(r);
    else list[i] = r;
    this.#byUpstream.set(upstream, r);
    if (old) this.#retire(old); // after the list has its replacement: moved requests may go there
  }

  /**
   * A service's own options; absent fields take the defaults. A changed read timeout applies to
   * its next requests: each replica gets a new pool, the old one closes after its answers.
   */
  setServiceOptions(serviceKey: string, o: ServiceOptions): void {
    const ms = o.readTimeoutMs;
    if (ms !== undefined && !(Number.isFinite(ms) && ms > 0)) throw new RangeError(`readTimeoutMs must be > 0, got ${ms}`);
    if (ms === this.#serviceReadMs.get(serviceKey)) return;
    if (ms === undefined) this.#serviceReadMs.delete(serviceKey);
    else this.#serviceReadMs.set(serviceKey, ms);
    for (const r of this.#services.get(serviceKey) ?? []) r.renewPool();
  }

  /**
   * The service a request our default server sends (no site of its own yet) is for, by its
   * Host; null removes the service's route. A host names one service at most: the document's
   * domains are unique, and a route set for another service replaces the old one.
   */
  setHostRoute(serviceKey: string, route: HostRoute | null): void {
    const old = this.#serviceHost.get(serviceKey);
    if (route !== null && sameRoute(old, route)) return;
    if (old !== undefined) {
      this.#serviceHost.delete(serviceKey);
      if (this.#hostService.get(old.host)?.serviceKey === serviceKey) this.#hostService.delete(old.host);
    }
    if (route === null) return;
    const prev = this.#hostService.get(route.host);
    if (prev !== undefined) this.#serviceHost.delete(prev.serviceKey);
    this.#hostService.set(route.host, { serviceKey, route });
    this.#serviceHost.set(serviceKey, route);
  }

  /** The service routed by `host` (lower case, no port), with its route. */
  routeForHost(host: string): { serviceKey: string; route: HostRoute } | undefined {
    return this.#hostService.get(host);
  }

  /**
   * The service left the document, but a site Nginx has not dropped yet may still name it.
   * `claimed`: the hosts the document still has (a service whose own site is on its way). See
   * successorOf(). Its replicas stay in rotation for the requests in flight and for claimed hosts.
   */
  setLeft(serviceKey: string, claimed: ReadonlySet<string>): void {
    this.#left.set(serviceKey, claimed);
  }

  /** Back in the document, or gone for good (its socket and replicas closed). */
  clearLeft(serviceKey: string): void {
    this.#left.delete(serviceKey);
  }

  /** Whether the service left the document (setLeft) and its sockets still serve. */
  hasLeft(serviceKey: string): boolean {
    return this.#left.size !== 0 && this.#left.has(serviceKey);
  }

  /**
   * Whom a request for a service that left (hasLeft) is for, by its host: the service routed by
   * that host, if any (a rename that kept the domain); else the service itself while another
   * service claims the host (its own site is not served yet); else null: the host has no
   * service any more, and is answered as an unknown host at once rather than at the next reload.
   */
  successorOf(serviceKey: string, host: string): string | null {
    return this.#hostService.get(host)?.serviceKey ?? (this.#left.get(serviceKey)?.has(host) ? serviceKey : null);
  }

  /** Every by-host route, by service. */
  hostRoutes(): ReadonlyMap<string, HostRoute> {
    return this.#serviceHost;
  }

  /** The services with a read timeout of their own (ms), live and without a copy. */
  serviceReadTimeouts(): ReadonlyMap<string, number> {
    return this.#serviceReadMs;
  }

  /** The services with options of their own, and those options. */
  serviceOptions(): ReadonlyMap<string, Readonly<ServiceOptions>> {
    const out = new Map<string, ServiceOptions>();
    for (const [k, readTimeoutMs] of this.#serviceReadMs) out.set(k, { readTimeoutMs });
    return out;
  }

  /** Out of rotation at once; its requests in flight are left to drain(). */
  remove(serviceKey: string, id: string): void {
    const list = this.#services.get(serviceKey);
    const i = list?.findIndex((r) => r.id === id) ?? -1;
    if (!list || i === -1) return;
    const r = list[i]!;
    list.splice(i, 1);
    if (list.length === 0) this.#services.delete(serviceKey);
    this.#retire(r);
  }

  /** Requests and pinned streams in flight through an upstream (in rotation or draining). */
  inFlight(upstream: Upstream): number {
    return this.#byUpstream.get(upstream)?.inFlight ?? 0;
  }

  /**
   * Resolves when nothing is in flight through the (removed) upstream, or after `ms`, when what
   * is left is cut. An upstream still in rotation is not draining: it resolves at once and is
   * left alone (cutting it would leave a replica in rotation with a destroyed pool).
   */
  drain(upstream: Upstream, ms: number): Promise<void> {
    const r = this.#byUpstream.get(upstream);
    if (!r || !r.removed) return Promise.resolve();
    if (r.inFlight === 0) {
      this.forget(r);
      return Promise.resolve();
    }
    return (r.drained ??= new Promise((resolve) => {
      const timer = this.#clock.setTimeout(() => {
        r.onIdle = null;
        r.destroy();
        this.forget(r);
        resolve();
      }, ms);
      r.onIdle = () => {
        this.#clock.clearTimeout(timer);
        r.onIdle = null;
        this.forget(r);
        resolve();
      };
    }));
  }

  /**
   * Sends one request to the Ready replica with the fewest in flight. Never throws: every
   * failure reaches `handler.onResponseError` (a DataPlaneError for no replica, or the last
   * replica's error).
   */
  dispatch(serviceKey: string, req: Http1Request, handler: Http1Handler): Http1Exchange {
    const d = new Dispatch(this, serviceKey, req, handler);
    d.next(true);
    return d;
  }

  /**
   * A raw stream to one Ready replica, for what cannot be relayed request by request (an
   * Upgrade, a connection we cannot frame): it stays on that replica until it closes, and counts
   * as one request in flight while open. Rejects with the catalog's error when none can be opened.
   */
  async open(serviceKey: string): Promise<Duplex> {
    let tried: Set<Replica> | null = null;
    let last: unknown = null;
    for (;;) {
      const r = this.pick(serviceKey, tried);
      if (r === null) throw finalError(serviceKey, last);
      (tried ??= new Set()).add(r);
      r.count();
      try {
        const stream = await this.openStream(r);
        if (r.destroyed) {
          // Cut while connecting: a stream handed out now would outlive the drain period.
          stream.destroy();
          throw new ConnectFailure(false, `the replica of ${serviceKey} was cut while connecting`);
        }
        r.pinned.add(stream);
        stream.once('close', () => {
          r.pinned.delete(stream);
          r.done();
        });
        return stream;
      } catch (err) {
        r.done();
        last = err;
        this.logger?.warn(
          { service: serviceKey, replica: r.id, err: errorText(err) },
          'opening an upstream failed; trying another replica',
        );
      }
    }
  }

  /** Every replica's load, those draining included. */
  loads(): ReplicaLoad[] {
    const out: ReplicaLoad[] = [];
    for (const r of this.#byUpstream.values()) {
      out.push({
        service: r.serviceKey,
        replica: r.id,
        ready: !r.removed && r.upstream.isReady(),
        draining: r.removed,
        inFlight: r.inFlight,
        requests: r.requests,
        total: r.tally.total,
      });
    }
    return out;
  }

  async close(): Promise<void> {
    for (const r of this.#byUpstream.values()) r.destroy();
    this.#byUpstream.clear();
    this.#services.clear();
    this.#tallies.clear();
  }

  /** The Ready replica with the fewest in flight, not in `skip`; among equals the one chosen longest ago. */
  pick(serviceKey: string, skip: ReadonlySet<Replica> | Replica | null): Replica | null {
    const list = this.#services.get(serviceKey);
    if (list === undefined) return null;
    let best: Replica | null = null;
    for (let i = 0; i < list.length; i++) {
      const r = list[i]!;
      if (skip !== null && (skip === r || (skip instanceof Set && skip.has(r)))) continue;
      if (!r.upstream.isReady()) continue;
      if (best === null || r.inFlight < best.inFlight || (r.inFlight === best.inFlight && r.chosen < best.chosen)) best = r;
    }
    return best;
  }

  /** A stream to the replica, within the connect timeout; failures are ConnectFailures. */
  openStream(r: Replica): Promise<Duplex> {
    return new Promise((resolve, reject) => {
      let done = false;
      const timer = this.#clock.setTimeout(() => {
        done = true;
        reject(new ConnectFailure(true, `opening a connection to ${r.serviceKey} took longer than ${this.#connectMs} ms`));
      }, this.#connectMs);
      new Promise<Duplex>((opened) => opened(r.upstream.open())).then(
        (stream) => {
          this.#clock.clearTimeout(timer);
          if (done) return void stream.destroy();
          // Requests are small writes answered by the replica: no Nagle delay on TCP replicas.
          if (stream instanceof NetSocket) stream.setNoDelay(true);
          resolve(stream);
        },
        (err: unknown) => {
          this.#clock.clearTimeout(timer);
          if (!done) reject(new ConnectFailure(false, errorText(err), { cause: err }));
        },
      );
    });
  }

  newPool(r: Replica): Http1Pool {
    const readMs = this.#serviceReadMs.get(r.serviceKey) ?? this.#readMs;
    return new Http1Pool({
      connect: () => this.openStream(r),
      maxConnections: this.#perReplica,
      keepAliveTimeoutMs: this.#keepAliveMs,
      headersTimeoutMs: readMs,
      bodyTimeoutMs: readMs,
      clock: this.#clock,
    });
  }

  #retire(r: Replica): void {
    r.retire();
    r.moveUnsent();
    if (r.inFlight === 0) this.forget(r);
  }

  /** A removed replica with nothing in flight leaves the books. */
  forget(r: Replica): void {
    if (this.#byUpstream.get(r.upstream) === r) this.#byUpstream.delete(r.upstream);
    if (r.forgotten) return;
    r.forgotten = true;
    if (--r.tally.refs > 0) return;
    const key = `${r.serviceKey}\0${r.id}`;
    if (this.#tallies.get(key) === r.tally) this.#tallies.delete(key);
  }
}
