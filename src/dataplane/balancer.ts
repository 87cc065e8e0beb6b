// The sockets Nginx connects to: one listening Unix socket per service, or (`shared`) one socket
// for them all, each request naming its service in a header the Nginx site sets. One socket is one
// upstream and one keep-alive pool in Nginx whatever the number of services; a socket per service
// is a pool (and a file, a bind) per service. Each accepted connection is relayed request by
// request (relay-connection.ts) to the replica replicas.ts chooses for each request; with no
// replica to take a request the client gets the catalog's JSON answer.
//
// The shared socket is bound per process, under instances/<id>/, and reached through a symbolic
// link at the path Nginx knows (<socketDir>/dataplane.sock). A gateway taking over from a
// running one (handOver) binds its own socket beside the old one and, once it serves the
// document, points the link at it with one rename: Nginx's next connection reaches the new
// process, its open ones stay with the old, which answers each next request on them with
// Connection: close and ends when they have all closed (close({ drainMs })). No reload, no
// connection refused in between.

import type { HostAuthorize } from './host-auth.js';
import { createHash } from 'node:crypto';
import { chmod, chown, mkdir, readdir, readlink, rename, rm, symlink, unlink } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../clock.js';
import { RelayConnection, type ModelApiHandOff } from './relay-connection.js';
import type { Replicas } from './replicas.js';
import { SHARED_SOCKET_NAME } from './service-header.js';

export { splice } from './splice.js';

export interface BalancerOptions {
  socketDir: string;
  /** The replicas requests are sent to. */
  replicas: Replicas;
  /**
   * One socket (<socketDir>/dataplane.sock) for every service, the service named per request by
   * SERVICE_HEADER; listenAll() then binds it once and records which services are served.
   * Default false: a socket per service.
   */
  shared?: boolean;
  /** The control-server token check of by-host requests for `auth: true` services; without it they answer 503. */
  hostAuth?: HostAuthorize;
  /** Where a connection for the gateway's model API goes (an entrypoint site's); without it they answer 503. */
  modelApi?: ModelApiHandOff;
  /**
   * With `shared`: the link at the shared path is left to a running gateway's socket until
   * publish() (a hand-over); without it, it points at this one's as soon as it is bound.
   */
  handOver?: boolean;
  /** Default 0o660 when socketGid is set, else 0o600. */
  socketMode?: number;
  /** chown the sockets to this user / group (the Nginx worker's). */
  socketUid?: number;
  socketGid?: number;
  logger?: Logger;
  /** The drain and successor timers. Default: the system clock. */
  clock?: Clock;
}

export interface BalancerStats {
  /** Connections accepted. */
  accepted: number;
  /** Requests relayed (a pinned connection, e.g. a WebSocket, counts as one). */
  requests: number;
  /** Requests answered by the balancer because no replica could take them (503/502/504). */
  unavailable: number;
}

/** The socket of a service under `socketDir`; stable for a given key. Short, so it fits sun_path (108 bytes). */
export function socketPathFor(socketDir: string, serviceKey: string): string {
  const slug = serviceKey.replace(/[^A-Za-z0-9_-]/g, '.').slice(0, 40);
  const h = createHash('sha256').update(serviceKey).digest('hex').slice(0, 8);
  return join(socketDir, `${slug}.${h}.sock`);
}

/** How often a stopping balancer looks whether a successor has taken the link. */
const SUCCESSOR_POLL_MS = 20;

/** Where each process binds its shared socket, under the socket dir. */
export const INSTANCES_DIR = 'instances';
let instances = 0;

/**
 * The process whose shared socket the link under `socketDir` leads to, if one accepts there:
 * its pid (null for a gateway that bound the path itself, without the link); undefined when
 * nothing answers.
 */
export async function liveDataPlane(socketDir: string): Promise<{ pid: number | null } | undefined> {
  const path = join(socketDir, SHARED_SOCKET_NAME);
  if (!(await accepts(path))) return undefined;
  const target = await readlink(path).catch(() => null);
  const m = target === null ? null : /^instances\/(\d+)\./.exec(target);
  return { pid: m ? Number(m[1]) : null };
}

/** Whether something accepts connections on the Unix socket at `path`. */
function accepts(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ path });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

export class Balancer {
  readonly stats: BalancerStats = { accepted: 0, requests: 0, unavailable: 0 };
  /** This balancer's own dir under INSTANCES_DIR: the pid first, so a successor knows whom to tell. */
  readonly #instance = `${process.pid}.${++instances}`;
  /** Accepted connections' relays, told to drain when a successor took the link. */
  readonly #relays = new Set<RelayConnection>();
  #published = false;
  /** awaitSuccessor() ran: close() does not wait a second time. */
  #waitedForSuccessor = false;
  readonly #o: BalancerOptions;
  readonly #servers = new Map<string, Server>();
  /** Accepted connections, closed with the balancer. */
  readonly #clients = new Set<Socket>();
  readonly #binding = new Map<string, Promise<void>>();
  /** With `shared`: the services served on the shared socket (listenAll'ed, not unlistened). */
  readonly #served = new Set<string>();
  #shared: Server | null = null;

  constructor(o: BalancerOptions) {
    this.#o = o;
  }

  /** The shared socket's path (the link Nginx connects through), or null with a socket per service. */
  get sharedSocketPath(): string | null {
    return this.#o.shared ? join(this.#o.socketDir, SHARED_SOCKET_NAME) : null;
  }

  /** The socket Nginx reaches a service at; stable for a given key. Short, so it fits sun_path (108 bytes). */
  socketPathFor(serviceKey: string): string {
    return this.sharedSocketPath ?? socketPathFor(this.#o.socketDir, serviceKey);
  }

  listening(): string[] {
    return this.#o.shared ? [...this.#served] : [...this.#servers.keys()];
  }

  /** The same services, live and without a copy: what a reconcile pass compares with. */
  listeningKeys(): { has(key: string): boolean; readonly size: number; keys(): Iterable<string> } {
    return this.#o.shared ? this.#served : this.#servers;
  }

  /**
   * Binds the sockets of services (replacing stale files; idempotent), many at once on a cold
   * start of 1,000s: the directory is made once and several binds are in flight. Returns the
   * error of each key that failed.
   */
  async listenAll(serviceKeys: readonly string[], concurrency = 16): Promise<Map<string, unknown>> {
    if (this.#o.shared) return this.#serve(serviceKeys);
    const failed = new Map<string, unknown>();
    const todo = serviceKeys.filter((k) => !this.#servers.has(k));
    if (todo.length === 0) return failed;
    await mkdir(this.#o.socketDir, { recursive: true, mode: 0o755 });
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < todo.length) {
        const key = todo[next++]!;
        // A bind of this key already in flight (listenAll() called again meanwhile) is joined, not repeated.
        let binding = this.#binding.get(key);
        if (!binding) {
          binding = this.#bind(key)
            .then((server) => void this.#servers.set(key, server))
            .finally(() => this.#binding.delete(key));
          this.#binding.set(key, binding);
        }
        await binding.catch((err: unknown) => failed.set(key, err));
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, todo.length) }, worker));
    return failed;
  }

  /**
   * Binds the shared socket now (once; joined while in flight), before any service needs it:
   * a daemon does this at start, so Nginx never finds the path missing (a 502) for a service
   * the document has just brought in.
   */
  listenShared(): Promise<void> {
    if (this.#shared !== null) return Promise.resolve();
    let binding = this.#binding.get('');
    if (!binding) {
      binding = (async () => {
        await this.#removeStaleInstances();
        await mkdir(join(this.#o.socketDir, INSTANCES_DIR, this.#instance), { recursive: true, mode: 0o755 });
        this.#shared = await this.#bind(null);
        if (!this.#o.handOver) await this.publish();
      })().finally(() => this.#binding.delete(''));
      this.#binding.set('', binding);
    }
    return binding;
  }

  /** The shared socket bound, then the services recorded as served. */
  async #serve(serviceKeys: readonly string[]): Promise<Map<string, unknown>> {
    const failed = new Map<string, unknown>();
    if (serviceKeys.length === 0) return failed;
    try {
      await this.listenShared();
    } catch (err) {
      for (const k of serviceKeys) failed.set(k, err);
      return failed;
    }
    for (const k of serviceKeys) this.#served.add(k);
    return failed;
  }

  /** Listens on a service's socket, or (null) on the shared one. */
  async #bind(serviceKey: string | null): Promise<Server> {
    const path = serviceKey === null ? this.#instancePath() : this.socketPathFor(serviceKey);
    // allowHalfOpen: a client's EOF ends only its side; the answer in flight (or a pinned
    // replica's bytes) still flows back.
    const server = createServer({ allowHalfOpen: true }, (sock) => this.#accept(serviceKey, sock));
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
    server.on('error', (err) => this.#o.logger?.error({ err, service: serviceKey ?? '(shared)' }, 'balancer socket error'));
    try {
      const mode = this.#o.socketMode ?? (this.#o.socketGid !== undefined ? 0o660 : 0o600);
      await chmod(path, mode);
      if (this.#o.socketUid !== undefined || this.#o.socketGid !== undefined)
        await chown(path, this.#o.socketUid ?? -1, this.#o.socketGid ?? -1);
    } catch (err) {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      throw err;
    }
    return server;
  }

  /**
   * Stops accepting on the service's socket and removes it; resolves at once. Connections
   * already accepted (Nginx keeps idle ones pooled) keep running: requests in flight finish
   * within their replica's drain(), later ones get the catalog's answer, and Nginx closes the
   * idle ones. Waiting for them here would hold up whoever removes the service.
   */
  async unlisten(serviceKey: string): Promise<void> {
    // On the shared socket a service no longer served has no replicas left either (the SSH loop
    // drops them first): its requests get the catalog's "no ready replica".
    if (this.#o.shared) return void this.#served.delete(serviceKey);
    const server = this.#servers.get(serviceKey);
    if (!server) return;
    this.#servers.delete(serviceKey);
    server.close(() => undefined);
    await unlink(this.socketPathFor(serviceKey)).catch(() => undefined);
  }

  /** This process's shared socket, bound under INSTANCES_DIR. */
  #instancePath(): string {
    return join(this.#o.socketDir, INSTANCES_DIR, this.#instance, SHARED_SOCKET_NAME);
  }

  /** The link's target, relative to the socket dir. */
  #linkTarget(): string {
    return join(INSTANCES_DIR, this.#instance, SHARED_SOCKET_NAME);
  }

  /**
   * Points the shared path at this process's socket (one rename: a connection reaches either
   * the old socket or this one, never nothing). A no-op before the socket is bound, or again.
   */
  async publish(): Promise<void> {
    if (this.#shared === null || this.#published) return;
    const temp = `${this.sharedSocketPath!}.${this.#instance}.tmp`;
    await rm(temp, { force: true });
    await symlink(this.#linkTarget(), temp);
    await rename(temp, this.sharedSocketPath!);
    this.#published = true;
  }

  /** Whether the shared path leads to this process's socket. */
  async #ownsLink(): Promise<boolean> {
    return (await readlink(this.sharedSocketPath!).catch(() => null)) === this.#linkTarget();
  }

  /** Instance dirs of processes gone (nothing accepts on their socket): a crash leaves them. */
  async #removeStaleInstances(): Promise<void> {
    const dir = join(this.#o.socketDir, INSTANCES_DIR);
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const name of names) {
      if (name === this.#instance || (await accepts(join(dir, name, SHARED_SOCKET_NAME)))) continue;
      await rm(join(dir, name), { recursive: true, force: true });
    }
  }

  /**
   * Stops serving. When another process has taken the shared link over (a hand-over), what is
   * in flight finishes: each open connection's next request is answered with Connection: close,
   * and close resolves once they have all closed, or after `drainMs` (then the rest are cut).
   *
   * With `successorWaitMs`, a balancer still holding the link goes on accepting for that long
   * first, until a successor takes the link (a restart: the new process starts only after this
   * one was told to stop), and then drains as above. Otherwise, or when none came, the link is
   * removed and open connections are cut at once, as nobody is left to answer them.
   */
  async close(o: { drainMs?: number; successorWaitMs?: number } = {}): Promise<void> {
    await Promise.all([...this.#servers.keys()].map((k) => this.unlisten(k)));
    const shared = this.#shared;
    if (shared && this.#published && !this.#waitedForSuccessor && (o.successorWaitMs ?? 0) > 0 && (await this.#ownsLink())) {
      await this.#awaitSuccessor(o.successorWaitMs!);
    }
    this.#served.clear();
    this.#shared = null;
    if (shared) {
      shared.close(() => undefined);
      const superseded = !(await this.#ownsLink());
      if (!superseded) await unlink(this.sharedSocketPath!).catch(() => undefined);
      await unlink(this.#instancePath()).catch(() => undefined);
      if (superseded && (o.drainMs ?? 0) > 0 && this.#clients.size > 0) await this.#drain(o.drainMs!);
      await rm(join(this.#o.socketDir, INSTANCES_DIR, this.#instance), { recursive: true, force: true });
    }
    for (const c of this.#clients) c.destroy();
  }

  /**
   * A restart, before anything here closes: the next process starts only once this one was told
   * to stop, so everything (this socket, and whatever the caller keeps open) serves on until a
   * successor takes the link, or `ms` passed. True when one took it; false at once when this
   * balancer does not hold the link. close() then waits no more.
   */
  async awaitSuccessor(ms: number): Promise<boolean> {
    if (!this.#shared || !this.#published || ms <= 0 || !(await this.#ownsLink())) return false;
    this.#waitedForSuccessor = true;
    await this.#awaitSuccessor(ms);
    return !(await this.#ownsLink());
  }

  /** Until the link leads elsewhere, or `ms` passed; this socket serves meanwhile. */
  async #awaitSuccessor(ms: number): Promise<void> {
    const clock = this.#o.clock ?? systemClock;
    this.#o.logger?.info({ successorWaitMs: ms }, 'serving on until another gateway takes the data plane over');
    const until = clock.now() + ms;
    while (clock.now() < until && (await this.#ownsLink())) {
      await new Promise<void>((resolve) => clock.setTimeout(resolve, SUCCESSOR_POLL_MS));
    }
  }

  /** Until every accepted connection has closed, or `ms` passed. */
  async #drain(ms: number): Promise<void> {
    this.#o.logger?.info({ connections: this.#clients.size, drainMs: ms }, 'another process serves the data plane now: draining');
    for (const r of this.#relays) r.drain();
    const clock = this.#o.clock ?? systemClock;
    await new Promise<void>((resolve) => {
      const timer = clock.setTimeout(done, ms);
      const check = (): void => {
        if (this.#clients.size === 0) done();
      };
      function done(): void {
        clock.clearTimeout(timer);
        resolve();
      }
      for (const c of this.#clients) c.once('close', () => process.nextTick(check));
      check();
    });
  }

  #accept(serviceKey: string | null, client: Socket): void {
    this.stats.accepted++;
    this.#clients.add(client);
    client.on('error', () => client.destroy());
    const relay = new RelayConnection(serviceKey, client, this.#o.replicas, this.stats, this.#o.hostAuth, this.#o.modelApi);
    this.#relays.add(relay);
    client.once('close', () => {
      this.#clients.delete(client);
      this.#relays.delete(relay);
    });
  }
}
