// A gateway whose document lives in a database (`--db`) keeps a copy of the last one it served
// in its state dir, so that a gateway (re)started while the database does not answer serves
// what it served before instead of nothing, and catches up once the database is back.
//
// - Every generation read or written through the database is copied to the cache (0600,
//   atomic), unless the copy already has it.
// - Opening the database fails as unreachable (DP_ERR_STATE_UNAVAILABLE) and a copy exists: the
//   store serves the copy, refuses writes (503), reports itself not connected, and tries to open
//   the database again every RETRY_MS; once it opens, the database's document takes over and
//   watchers hear of it.
// - A database behind the copy (restored from an older backup) is not served: the copy's newer
//   document stays until the database catches up, and health() says why.

import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { systemClock, type Clock, type TimerHandle } from '../clock.js';
import { ProxyError } from '../errors.js';
import { validate } from '../spec/index.js';
import { writeAtomic } from '../write-atomic.js';
import type { StoredState, WriteOptions, WriteResult } from './store.js';
import type { ChangeListener, StoreHealth, WatchedStateStore } from './watched-store.js';

/** How often a gateway started on its copy tries the database again. */
const RETRY_MS = 2_000;

export interface CachedStoreOptions {
  /** Opens the database's store; rejects with DP_ERR_STATE_UNAVAILABLE when it does not answer. */
  open: () => Promise<WatchedStateStore>;
  /** The copy, e.g. <state-dir>/document-copy.json. */
  cacheFile: string;
  logger?: Logger;
  clock?: Clock;
}

export async function openCachedStore(o: CachedStoreOptions): Promise<WatchedStateStore> {
  const store = new CachedStore(o);
  await store.start();
  return store;
}

class CachedStore implements WatchedStateStore {
  get kind(): WatchedStateStore['kind'] {
    return this.#inner?.kind ?? 'postgres';
  }
  #inner: WatchedStateStore | undefined;
  /** The newest document served: from the copy at first, then the database's. */
  #current: StoredState | undefined;
  #cachedGeneration = -1;
  readonly #listeners = new Set<ChangeListener>();
  #unwatch: (() => void) | undefined;
  #retry: TimerHandle | undefined;
  #closed = false;
  #behind: string | undefined;
  readonly #clock: Clock;

  constructor(private readonly o: CachedStoreOptions) {
    this.#clock = o.clock ?? systemClock;
  }

  async start(): Promise<void> {
    try {
      await this.#attach(await this.o.open());
    } catch (err) {
      if (!(err instanceof ProxyError) || err.code !== 'DP_ERR_STATE_UNAVAILABLE') throw err;
      const copy = await readCopy(this.o.cacheFile);
      if (copy === undefined) throw err;
      this.#current = copy;
      this.#cachedGeneration = copy.generation;
      this.o.logger?.warn(
        { generation: copy.generation, file: this.o.cacheFile, err: err.message },
        'the database does not answer: serving the copy of the last document this gateway served',
      );
      this.#scheduleRetry();
    }
  }

  #scheduleRetry(): void {
    if (this.#closed) return;
    this.#retry = this.#clock.setTimeout(() => {
      this.o
        .open()
        .then((inner) => this.#attach(inner))
        .then(
          () => this.o.logger?.info('the database answers again: serving its document'),
          () => this.#scheduleRetry(),
        );
    }, RETRY_MS);
  }

  async #attach(inner: WatchedStateStore): Promise<void> {
    if (this.#closed) return void (await inner.close());
    this.#inner = inner;
    const first = await inner.read().catch(() => undefined);
    if (first) this.#take(first);
    if (this.#listeners.size > 0) this.#unwatch = inner.watch((s) => this.#take(s));
  }

  /** A document from the database: served unless it is behind the one served already. */
  #take(s: StoredState): void {
    const current = this.#current;
    if (current && s.generation < current.generation) {
      this.#behind = `the database holds generation ${s.generation}, behind the ${current.generation} this gateway served: kept until it catches up`;
      this.o.logger?.warn({ database: s.generation, served: current.generation }, this.#behind);
      return;
    }
    this.#behind = undefined;
    const changed = current === undefined || current.generation !== s.generation || current.hash !== s.hash;
    this.#current = s;
    void this.#copy(s);
    if (changed && current !== undefined) for (const l of this.#listeners) l(s);
  }

  async #copy(s: StoredState): Promise<void> {
    if (s.generation === this.#cachedGeneration) return;
    this.#cachedGeneration = s.generation;
    try {
      await writeAtomic(this.o.cacheFile, JSON.stringify(s), { mode: 0o600, makeDir: true, dirMode: 0o700 });
    } catch (err) {
      this.o.logger?.warn({ err, file: this.o.cacheFile }, 'cannot keep a copy of the document');
      this.#cachedGeneration = -1;
    }
  }

  async read(): Promise<StoredState> {
    if (this.#inner) {
      const s = await this.#inner.read();
      this.#take(s);
    }
    if (!this.#current) throw new ProxyError('DP_ERR_STATE_UNAVAILABLE', 'no document yet');
    return this.#current;
  }

  async write(state: StoredState['state'], options?: WriteOptions): Promise<WriteResult> {
    if (!this.#inner) {
      throw new ProxyError(
        'DP_ERR_STATE_UNAVAILABLE',
        'the database does not answer: this gateway serves its copy of the last document and takes no change until the database is back',
      );
    }
    const r = await this.#inner.write(state, options);
    await this.read().catch(() => undefined);
    return r;
  }

  watch(listener: ChangeListener): () => void {
    this.#listeners.add(listener);
    if (this.#inner && this.#unwatch === undefined) this.#unwatch = this.#inner.watch((s) => this.#take(s));
    return () => {
      this.#listeners.delete(listener);
      if (this.#listeners.size === 0) {
        this.#unwatch?.();
        this.#unwatch = undefined;
      }
    };
  }

  health(): StoreHealth {
    const h: StoreHealth = this.#inner?.health() ?? {
      kind: 'postgres',
      generation: this.#current?.generation,
      storedGeneration: undefined,
      connected: false,
      lastError: {
        reason: 'unreachable',
        message: 'the database did not answer at start; serving the copy',
        at: new Date(this.#clock.now()).toISOString(),
      },
    };
    if (this.#behind)
      return {
        ...h,
        generation: this.#current?.generation,
        lastError: { reason: 'unreachable', message: this.#behind, at: new Date(this.#clock.now()).toISOString() },
      };
    return h;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#retry !== undefined) this.#clock.clearTimeout(this.#retry);
    this.#unwatch?.();
    await this.#inner?.close();
  }
}

/** The copy, checked as a document: a damaged one is as good as none. */
async function readCopy(file: string): Promise<StoredState | undefined> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch {
    return undefined;
  }
  try {
    const s = JSON.parse(text) as StoredState;
    const v = validate(s.state);
    if (!v.ok || !Number.isInteger(s.generation) || typeof s.hash !== 'string') return undefined;
    return { ...s, state: v.state };
  } catch {
    return undefined;
  }
}
