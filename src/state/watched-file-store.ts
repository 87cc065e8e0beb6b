// The gateway's state.json store (file-store.ts) with the WatchedStateStore additions, so
// every store can be opened by URL and watched the same way. state.json changed behind our
// back (another process, a restore) is picked up by polling its stat signature every 250 ms;
// an invalid file is reported by health() and the last good document stays current.

import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { every, systemClock, type Clock } from '../clock.js';
import type { ProxyState } from '../spec/index.js';
import { STATE_FILE, loadStateFile, openFileStore, type FileStoreOptions } from './file-store.js';
import type { StateStore, StoredState, WriteOptions, WriteResult } from './store.js';
import { RowTracker, type ChangeListener, type StoreHealth, type WatchedStateStore } from './watched-store.js';
import { ProxyError } from '../errors.js';

export interface WatchedFileStoreOptions extends FileStoreOptions {
  /** How often watchers stat state.json. Default 250 ms. */
  pollMs?: number;
  /** Timestamps and the watch poll. Default systemClock. */
  clock?: Clock;
  logger?: Logger;
}

export async function openWatchedFileStore(options: WatchedFileStoreOptions): Promise<WatchedStateStore> {
  const inner = await openFileStore(options);
  const store = new WatchedFileStore(inner, options);
  await store.read();
  return store;
}

class WatchedFileStore implements WatchedStateStore {
  readonly kind = 'file' as const;
  private readonly tracker: RowTracker;
  private readonly file: string;
  /** ino:size:mtime of the state.json last loaded or written. */
  private signature: string | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  /** Our own writes accepted and not yet on disk: the file changes under us meanwhile, and that is not news. */
  private writesInFlight = 0;
  private stopPolling: (() => void) | undefined;
  private readonly clock: Clock;

  constructor(
    private inner: StateStore,
    private readonly options: WatchedFileStoreOptions,
  ) {
    this.clock = options.clock ?? systemClock;
    this.tracker = new RowTracker('file', options.logger, this.clock);
    this.file = path.join(options.stateDir, STATE_FILE);
  }

  /** The newest good document, once every write accepted before this call has settled. */
  async read(): Promise<StoredState> {
    await this.inner.read();
    return this.serialised(async () => {
      await this.refresh();
      const good = this.tracker.current;
      if (!good) throw new ProxyError('DP_ERR_STATE_CORRUPT', this.tracker.health().lastError?.message ?? `${this.file} is invalid`);
      return good;
    });
  }

  async write(state: ProxyState, options?: WriteOptions): Promise<WriteResult> {
    // Only the acceptance (If-Match, no-op check, generation) runs in the queue; the wait for
    // the disk does not, so writes arriving meanwhile share the inner store's next file write.
    const { durable } = await this.serialised(async () => {
      await this.refresh();
      this.writesInFlight++;
      return { durable: this.inner.write(state, options) };
    });
    let result: WriteResult;
    try {
      result = await durable;
    } catch (err) {
      await this.serialised(async () => void this.writesInFlight--);
      throw err;
    }
    // Callers are resumed in generation order, so the tracker hears the generations in order.
    await this.serialised(async () => {
      this.writesInFlight--;
      if (!result.changed) return;
      this.signature = await signature(this.file);
      const { changed: _changed, ...stored } = result;
      this.tracker.wrote(stored);
    });
    return result;
  }

  watch(listener: ChangeListener): () => void {
    const unsubscribe = this.tracker.subscribe(listener);
    this.stopPolling ??= every(
      this.clock,
      this.options.pollMs ?? 250,
      () => void this.serialised(() => this.refresh()).catch(() => undefined),
    );
    return () => {
      unsubscribe();
      if (!this.tracker.watched) {
        this.stopPolling?.();
        this.stopPolling = undefined;
      }
    };
  }

  health(): StoreHealth {
    return this.tracker.health();
  }

  async close(): Promise<void> {
    this.stopPolling?.();
    this.stopPolling = undefined;
    await this.queue;
    await this.inner.close();
  }

  /** Load state.json again if its signature changed since we last loaded or wrote it. */
  private async refresh(): Promise<void> {
    if (this.writesInFlight > 0) return;
    const sig = await signature(this.file);
    if (sig === this.signature) return;
    this.signature = sig;
    let loaded: StoredState;
    try {
      loaded = await loadStateFile(this.file);
    } catch (err) {
      this.tracker.reject(`${(err as Error).message}; serving the last good generation`);
      return;
    }
    const good = this.tracker.current;
    if (good && (loaded.generation !== good.generation || loaded.hash !== good.hash)) {
      // Written by someone else: the inner store's cached generation is stale.
      const stale = this.inner;
      this.inner = await openFileStore(this.options);
      await stale.close();
    }
    this.tracker.wrote(loaded);
  }

  private serialised<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn);
    this.queue = run.catch(() => undefined);
    return run;
  }
}

async function signature(file: string): Promise<string> {
  try {
    const s = await fs.stat(file, { bigint: true });
    return `${s.ino}:${s.size}:${s.mtimeNs}`;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'missing';
    throw err;
  }
}
