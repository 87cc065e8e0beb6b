// The per-service balancer: one listening Unix socket per service. Each accepted connection
// goes to a Ready replica with the fewest active connections (ties random); when opening the
// upstream fails, another Ready replica is tried. With none left the client gets a 503 JSON
// response. connect(serviceKey) offers the same choice in-process (the in-server proxy).

import { createHash } from 'node:crypto';
import { chmod, chown, mkdir, unlink } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../../clock.js';

/** Where a replica's bytes go: an SSH tunnel or a plain TCP address. */
export interface Upstream {
  isReady(): boolean;
  open(): Promise<Duplex>;
}

export interface BalancerOptions {
  socketDir: string;
  /** Default 0o660 when socketGid is set, else 0o600. */
  socketMode?: number;
  /** chown the sockets to this user / group (the Nginx worker's). */
  socketUid?: number;
  socketGid?: number;
  random?: () => number;
  logger?: Logger;
  /** drain()'s deadline. Default: the system clock. */
  clock?: Clock;
}

/** connect() found no Ready replica (or every one failed to open). */
export class NoReadyReplicaError extends Error {
  readonly status = 503;
  constructor(service: string) {
    super(`Service ${service} has no ready replica`);
    this.name = 'NoReadyReplicaError';
  }
}

export interface BalancerStats {
  accepted: number;
  unavailable: number;
  openFailures: number;
}

interface ServiceEntry {
  replicas: Map<string, Upstream>;
  server: Server | null;
}

export class Balancer {
  readonly stats: BalancerStats = { accepted: 0, unavailable: 0, openFailures: 0 };
  readonly #o: BalancerOptions;
  readonly #random: () => number;
  readonly #clock: Clock;
  readonly #services = new Map<string, ServiceEntry>();
  /** Open streams per upstream, including upstreams already removed (draining). */
  readonly #conns = new Map<Upstream, Set<Duplex>>();
  readonly #idle = new Map<Upstream, () => void>();
  readonly #opening = new Map<Upstream, number>();
  readonly #binding = new Map<string, Promise<void>>();

  constructor(o: BalancerOptions) {
    this.#o = o;
    this.#random = o.random ?? Math.random;
    this.#clock = o.clock ?? systemClock;
  }

  /** The socket of a service; stable for a given key. Short, so it fits sun_path (108 bytes). */
  socketPathFor(serviceKey: string): string {
    const slug = serviceKey.replace(/[^A-Za-z0-9_-]/g, '.').slice(0, 40);
    const h = createHash('sha256').update(serviceKey).digest('hex').slice(0, 8);
    return join(this.#o.socketDir, `${slug}.${h}.sock`);
  }

  listening(): string[] {
    return [...this.#services].filter(([, e]) => e.server !== null).map(([k]) => k);
  }

  /**
   * Binds the sockets of services (replacing stale files; idempotent), many at once on a cold
   * start of 1,000s: the directory is made once and several binds are in flight. Returns the
   * error of each key that failed.
   */
  async listenAll(serviceKeys: readonly string[], concurrency = 16): Promise<Map<string, unknown>> {
    const failed = new Map<string, unknown>();
    const todo = serviceKeys.filter((k) => this.#services.get(k)?.server == null);
    if (todo.length === 0) return failed;
    await mkdir(this.#o.socketDir, { recursive: true, mode: 0o755 });
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < todo.length) {
        const key = todo[next++]!;
        // A bind of this key already in flight (listenAll() called again meanwhile) is joined, not repeated.
        let binding = this.#binding.get(key);
        if (!binding) {
          binding = this.#bind(key).finally(() => this.#binding.delete(key));
          this.#binding.set(key, binding);
        }
        await binding.catch((err: unknown) => failed.set(key, err));
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, todo.length) }, worker));
    return failed;
  }

  async #bind(serviceKey: string): Promise<void> {
    const path = this.socketPathFor(serviceKey);
    // pauseOnConnect: no read is started (and stopped again) before the upstream is open.
    // allowHalfOpen: a client's EOF goes upstream while the reply still flows back.
    const server = createServer({ pauseOnConnect: true, allowHalfOpen: true }, (sock) => this.#accept(serviceKey, sock));
    const listen = (): Promise<void> =>
      new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(path, () => {
          server.removeListener('error', reject);
          resolve();
        });
      });
    // A file left at the path (a previous run's socket) is removed only when it is in the way:
    // one unlink per stale socket instead of one per bind.
    await listen().catch(async (err: NodeJS.ErrnoException) => {
      if (err.code !== 'EADDRINUSE') throw err;
      await unlink(path).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'ENOENT') throw e;
      });
      await listen();
    });
    server.on('error', (err) => this.#o.logger?.error({ err, service: serviceKey }, 'balancer socket error'));
    try {
      const mode = this.#o.socketMode ?? (this.#o.socketGid !== undefined ? 0o660 : 0o600);
      await chmod(path, mode);
      if (this.#o.socketUid !== undefined || this.#o.socketGid !== undefined)
        await chown(path, this.#o.socketUid ?? -1, this.#o.socketGid ?? -1);
    } catch (err) {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      throw err;
    }
    this.#entry(serviceKey).server = server;
  }

  /**
   * Stops accepting on the service's socket and removes it; resolves at once. Connections
   * already accepted (Nginx keeps idle ones pooled) keep running and end with their upstream's
   * drain(): waiting for them here would hold up whoever removes the service.
   */
  async unlisten(serviceKey: string): Promise<void> {
    const entry = this.#services.get(serviceKey);
    if (!entry?.server) return;
    const server = entry.server;
    entry.server = null;
    if (entry.replicas.size === 0) this.#services.delete(serviceKey);
    server.close(() => undefined);
    await unlink(this.socketPathFor(serviceKey)).catch(() => undefined);
  }

  setReplica(serviceKey: string, id: string, upstream: Upstream): void {
    this.#entry(serviceKey).replicas.set(id, upstream);
  }

  /** Out of rotation at once; its open connections are left to drain(). */
  removeReplica(serviceKey: string, id: string): void {
    const entry = this.#services.get(serviceKey);
    if (!entry) return;
    entry.replicas.delete(id);
    if (entry.replicas.size === 0 && entry.server === null) this.#services.delete(serviceKey);
  }

  /** Open connections of an upstream (in rotation or draining). */
  activeConnections(upstream: Upstream): number {
    return this.#conns.get(upstream)?.size ?? 0;
  }

  /** Resolves when the upstream has no open connection, or after `ms` (then destroys the rest). */
  drain(upstream: Upstream, ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.activeConnections(upstream) === 0) return resolve();
      const timer = this.#clock.setTimeout(() => {
        this.#idle.delete(upstream);
        for (const s of this.#conns.get(upstream) ?? []) s.destroy();
        resolve();
      }, ms);
      this.#idle.set(upstream, () => {
        this.#clock.clearTimeout(timer);
        resolve();
      });
    });
  }

  /** An upstream stream for one new connection to the service; counted until it closes. */
  async connect(serviceKey: string): Promise<Duplex> {
    const tried = new Set<string>();
    for (;;) {
      const pick = this.#pick(serviceKey, tried);
      if (pick === null) throw new NoReadyReplicaError(serviceKey);
      tried.add(pick.id);
      // Opens in flight count as connections, so a burst spreads instead of piling on one replica.
      this.#opening.set(pick.upstream, (this.#opening.get(pick.upstream) ?? 0) + 1);
      try {
        const stream = await pick.upstream
          .open()
          .finally(() => this.#opening.set(pick.upstream, (this.#opening.get(pick.upstream) ?? 1) - 1));
        this.#track(pick.upstream, stream);
        return stream;
      } catch (err) {
        this.stats.openFailures++;
        this.#o.logger?.warn(
          { service: serviceKey, replica: pick.id, err: err instanceof Error ? err.message : String(err) },
          'opening an upstream failed; trying another replica',
        );
      }
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.#services.keys()].map((k) => this.unlisten(k)));
    for (const set of this.#conns.values()) for (const s of set) s.destroy();
    this.#services.clear();
  }

  #entry(serviceKey: string): ServiceEntry {
    let e = this.#services.get(serviceKey);
    if (!e) {
      e = { replicas: new Map(), server: null };
      this.#services.set(serviceKey, e);
    }
    return e;
  }

  /** Least active connections among Ready replicas not yet tried; ties broken at random. */
  #pick(serviceKey: string, tried: ReadonlySet<string>): { id: string; upstream: Upstream } | null {
    const entry = this.#services.get(serviceKey);
    if (!entry) return null;
    let best: { id: string; upstream: Upstream }[] = [];
    let min = Infinity;
    for (const [id, upstream] of entry.replicas) {
      if (tried.has(id) || !upstream.isReady()) continue;
      const n = this.activeConnections(upstream) + (this.#opening.get(upstream) ?? 0);
      if (n < min) {
        min = n;
        best = [{ id, upstream }];
      } else if (n === min) best.push({ id, upstream });
    }
    if (best.length === 0) return null;
    return best[Math.floor(this.#random() * best.length)] ?? best[0]!;
  }

  #track(upstream: Upstream, stream: Duplex): void {
    let set = this.#conns.get(upstream);
    if (!set) this.#conns.set(upstream, (set = new Set()));
    set.add(stream);
    stream.once('close', () => {
      set.delete(stream);
      if (set.size > 0) return;
      this.#conns.delete(upstream);
      const idle = this.#idle.get(upstream);
      this.#idle.delete(upstream);
      idle?.();
    });
  }

  #accept(serviceKey: string, client: Socket): void {
    this.stats.accepted++;
    client.on('error', () => client.destroy());
    this.connect(serviceKey).then(
      (up) => {
        if (client.destroyed) {
          up.destroy();
          return;
        }
        splice(client, up);
        client.resume();
      },
      (err: unknown) => {
        this.stats.unavailable++;
        client.resume(); // read and drop the request
        client.end(unavailableResponse(err instanceof Error ? err.message : 'no ready replica'));
      },
    );
  }
}

/**
 * Joins the accepted client and the upstream stream: bytes both ways with backpressure, EOF
 * passed on, and when either side closes the other is released. Cheaper than two pipe()s
 * (no unpipe bookkeeping).
 */
export function splice(client: Socket, up: Duplex): void {
  const forward = (from: Duplex, to: Duplex): void => {
    from.on('data', (chunk: Buffer) => {
      if (to.writableEnded || to.destroyed) return; // the other side is gone: drop
      if (to.write(chunk)) return;
      from.pause();
      to.once('drain', () => from.resume());
    });
    from.once('end', () => {
      if (!to.writableEnded) to.end();
    });
  };
  forward(client, up);
  forward(up, client);
  up.on('error', () => up.destroy());
  up.once('close', () => {
    if (!client.writableEnded) client.destroy(); // else let the ended client flush
  });
  client.once('close', () => {
    // ssh2 emits a channel's 'close' only after its 'end': drain what is left unread.
    up.resume();
    up.destroy();
  });
}

/** The raw HTTP/1.1 503 a client gets when no replica is Ready. */
export function unavailableResponse(detail: string): string {
  const body = JSON.stringify({ detail });
  return (
    'HTTP/1.1 503 Service Unavailable\r\n' +
    'Content-Type: application/json\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    'Connection: close\r\n\r\n' +
    body
  );
}
