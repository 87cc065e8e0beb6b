// A directory of Unix sockets, each reaching one process of the control server.
//
// dstack's server opens one reverse-forwarded socket per server process (sshd `-R`, named by a
// fresh uuid), so a directory holds one live socket per running server replica plus the stale
// files of servers that died or reconnected under a new name: sshd does not remove them, and a
// connect to them is refused. Each question goes to the sockets in random order until one gives
// an HTTP answer, which spreads the checks over the server replicas and fails over between them.
//
// A socket that failed rests: it is tried only after the others until `restMs` have passed, so a
// check does not pay for every dead file. A socket refused for `unlinkAfterMs` (twice at least,
// with no answer between) is unlinked, or the directory would grow with every server restart.
// Only what lstat shows to be a socket is ever connected to or unlinked: no symlink is followed
// out of the directory, no regular file is touched.

import { lstat, readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { Agent, type Dispatcher } from 'undici';
import type { Clock } from '../clock.js';

export interface SocketDirOptions {
  /** Absolute path of the directory. */
  dir: string;
  clock: Clock;
  logger?: Logger;
  /** How long one connect may take. */
  connectTimeoutMs: number;
  /** How long a socket that failed is tried only after the others. Default 30 s. */
  restMs?: number;
  /** Refusals spanning this long (two at least, no answer between) unlink the socket. Default 2 min. */
  unlinkAfterMs?: number;
  /** In [0, 1), as Math.random; tests pass a fixed one. */
  random?: () => number;
}

export const DEFAULT_SOCKET_REST_MS = 30_000; // 30 s
export const DEFAULT_SOCKET_UNLINK_AFTER_MS = 120_000; // 2 min, as dstack's own gateway

/** No socket of the directory gave an answer. The directory has logged why. */
export class NoSocketAnswered extends Error {
  constructor(dir: string) {
    super(`no socket in ${dir} answered`);
    this.name = 'NoSocketAnswered';
  }
}

/** What a socket did the last time it was tried. */
export type SocketHealth = 'new' | 'ok' | 'failing';

export interface SocketView {
  name: string;
  health: SocketHealth;
  /** Failed tries since its last answer. */
  failures: number;
}

interface SocketState {
  /** The inode the state is about: a file replaced under the same name starts afresh. */
  ino: number;
  agent: Agent;
  health: SocketHealth;
  failures: number;
  /** Until when it is tried only after the others. */
  restUntil: number;
  /** First and count of the refusals since its last answer. */
  refusedSince?: number;
  refusals: number;
  removing?: boolean;
}

type Failure = 'timeout' | 'gone' | 'refused' | 'failed';

function codeOf(err: unknown): string {
  const e = err as { code?: unknown; name?: unknown } | null;
  if (e && typeof e.code === 'string') return e.code;
  if (e && typeof e.name === 'string') return e.name;
  return 'unknown';
}

/** Why an attempt gave no answer; a timeout spends the whole check, the rest moves on. */
function classify(err: unknown, signal: AbortSignal): Failure {
  if (signal.aborted) return 'timeout';
  const code = codeOf(err);
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'AbortError' || code === 'TimeoutError') {
    return 'timeout';
  }
  // The file went away between the listing and the connect: nothing to remember.
  if (code === 'ENOENT') return 'gone';
  // Nobody listens: the file of a server process that is gone.
  if (code === 'ECONNREFUSED') return 'refused';
  // EACCES, ENOTSOCK, EAGAIN (a full backlog), a connection closed before any answer (a
  // forward whose far end is gone): not provably dead, so rested but never unlinked.
  return 'failed';
}

function shuffle<T>(items: T[], random: () => number): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j]!, items[i]!];
  }
  return items;
}

export class SocketDir {
  readonly #dir: string;
  readonly #clock: Clock;
  readonly #logger: Logger | undefined;
  readonly #connectTimeoutMs: number;
  readonly #restMs: number;
  readonly #unlinkAfterMs: number;
  readonly #random: () => number;
  readonly #sockets = new Map<string, SocketState>();
  /** Whether the last check found a socket that answered; logged when it changes. */
  #answering: boolean | undefined;
  #closed = false;

  constructor(o: SocketDirOptions) {
    this.#dir = o.dir;
    this.#clock = o.clock;
    this.#logger = o.logger;
    this.#connectTimeoutMs = o.connectTimeoutMs;
    this.#restMs = o.restMs ?? DEFAULT_SOCKET_REST_MS;
    this.#unlinkAfterMs = o.unlinkAfterMs ?? DEFAULT_SOCKET_UNLINK_AFTER_MS;
    this.#random = o.random ?? Math.random;
  }

  /**
   * Runs `attempt` against the sockets in turn (rested ones last) until one resolves, and
   * returns its result. An attempt that rejects moves on to the next socket, unless `signal`
   * ended the check. Rejects with NoSocketAnswered when none answered.
   */
  async send<T>(attempt: (dispatcher: Dispatcher) => Promise<T>, signal: AbortSignal): Promise<T> {
    let listError: string | undefined;
    let names: string[] = [];
    try {
      names = await this.#list();
    } catch (err) {
      listError = codeOf(err);
    }
    const now = this.#clock.now();
    const ready: string[] = [];
    const resting: string[] = [];
    for (const name of names) ((this.#sockets.get(name)?.restUntil ?? 0) > now ? resting : ready).push(name);
    const order = [...shuffle(ready, this.#random), ...shuffle(resting, this.#random)];
    for (const name of order) {
      if (this.#closed || signal.aborted) break;
      const s = await this.#state(name);
      if (!s) continue;
      try {
        const result = await attempt(s.agent);
        this.#answered(name, s);
        return result;
      } catch (err) {
        const failure = classify(err, signal);
        await this.#failed(name, s, failure, codeOf(err));
        if (failure === 'timeout') break;
      }
    }
    this.#setAnswering(false, listError ?? (names.length === 0 ? 'no sockets' : 'none answered'));
    throw new NoSocketAnswered(this.#dir);
  }

  /** The sockets known from the last check, for status and tests. */
  view(): SocketView[] {
    return [...this.#sockets].map(([name, s]) => ({ name, health: s.health, failures: s.failures }));
  }

  async close(): Promise<void> {
    this.#closed = true;
    const agents = [...this.#sockets.values()].map((s) => s.agent);
    this.#sockets.clear();
    await Promise.all(agents.map((a) => a.close()));
  }

  /** `*.sock` entries that are sockets (not symlinks), like the shell glob (no dot files). */
  async #list(): Promise<string[]> {
    const entries = await readdir(this.#dir, { withFileTypes: true });
    const names = entries.filter((e) => e.name.endsWith('.sock') && !e.name.startsWith('.') && e.isSocket()).map((e) => e.name);
    // Forget what left the directory.
    const present = new Set(names);
    for (const [name, s] of this.#sockets) if (!present.has(name)) this.#drop(name, s);
    return names;
  }

  /** The state of `name` if it still is a socket, made afresh for a new file under that name. */
  async #state(name: string): Promise<SocketState | undefined> {
    const path = join(this.#dir, name);
    let ino: number | undefined;
    try {
      const st = await lstat(path);
      if (st.isSocket()) ino = st.ino;
    } catch {
      // gone since the listing
    }
    // Read after the await: a concurrent check may have made the state meanwhile.
    const known = this.#sockets.get(name);
    if (ino === undefined) {
      if (known) this.#drop(name, known);
      return undefined;
    }
    if (known && known.ino === ino) return known;
    if (known) this.#drop(name, known);
    const s: SocketState = {
      ino,
      agent: new Agent({ connect: { socketPath: path, timeout: this.#connectTimeoutMs } }),
      health: 'new',
      failures: 0,
      restUntil: 0,
      refusals: 0,
    };
    this.#sockets.set(name, s);
    return s;
  }

  #answered(name: string, s: SocketState): void {
    if (s.health === 'failing') this.#logger?.info({ socket: name, dir: this.#dir }, 'auth socket answers again');
    else if (s.health === 'new') this.#logger?.debug({ socket: name, dir: this.#dir }, 'auth socket answers');
    s.health = 'ok';
    s.failures = 0;
    s.restUntil = 0;
    s.refusedSince = undefined;
    s.refusals = 0;
    this.#setAnswering(true);
  }

  async #failed(name: string, s: SocketState, failure: Failure, code: string): Promise<void> {
    if (failure === 'gone') {
      this.#drop(name, s);
      return;
    }
    const now = this.#clock.now();
    if (s.health !== 'failing') {
      this.#logger?.warn({ socket: name, dir: this.#dir, code }, 'auth socket failed; the others are tried first for a while');
    }
    s.health = 'failing';
    s.failures++;
    s.restUntil = now + this.#restMs;
    if (failure !== 'refused') return;
    s.refusedSince ??= now;
    s.refusals++;
    if (s.refusals >= 2 && now - s.refusedSince >= this.#unlinkAfterMs) await this.#unlinkStale(name, s);
  }

  /** Unlinks a socket nobody listens on, if the file still is the one that was refused. */
  async #unlinkStale(name: string, s: SocketState): Promise<void> {
    // Concurrent checks may all see the last refusal: one removes.
    if (s.removing || this.#sockets.get(name) !== s) return;
    s.removing = true;
    const path = join(this.#dir, name);
    try {
      const st = await lstat(path);
      if (!st.isSocket() || st.ino !== s.ino) return;
      await unlink(path);
      this.#logger?.info(
        { socket: name, dir: this.#dir, refusals: s.refusals, sinceMs: this.#clock.now() - (s.refusedSince ?? 0) },
        'removed a stale auth socket (its connects were refused for minutes)',
      );
    } catch (err) {
      s.removing = false;
      this.#logger?.warn({ socket: name, dir: this.#dir, code: codeOf(err) }, 'could not remove a stale auth socket');
      return;
    }
    this.#drop(name, s);
  }

  #drop(name: string, s: SocketState): void {
    if (this.#sockets.get(name) === s) this.#sockets.delete(name);
    void s.agent.close().catch(() => undefined);
  }

  #setAnswering(answering: boolean, why?: string): void {
    if (this.#answering === answering) return;
    // The first check of a healthy directory is not news; a failing one is.
    if (answering && this.#answering === false) this.#logger?.info({ dir: this.#dir }, 'a socket answers the auth checks again');
    if (!answering) this.#logger?.warn({ dir: this.#dir, why }, 'no socket answered the auth check; protected requests are refused');
    this.#answering = answering;
  }
}
