// The embedded state store: one SQLite file (WAL), created 0600 because the document holds
// secrets. Schema in docs/database.md; migrations are versioned in proxy_schema_migrations and
// run inside BEGIN IMMEDIATE, so two processes opening the file at once apply them once.
// Watching polls `PRAGMA data_version` (changes when another connection commits) every 250 ms.

import { closeSync, mkdirSync, openSync, chmodSync, existsSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { mismatch } from './store.js';
import type { Logger } from 'pino';
import { every, systemClock, type Clock } from '../clock.js';
import { ProxyError } from '../errors.js';
import { emptyState, hashSpec, type ProxyState } from '../spec/index.js';
import type { StoredState, WriteOptions, WriteResult } from './store.js';
import { RowTracker, documentJson, type ChangeListener, type RawRow, type StoreHealth, type WatchedStateStore } from './watched-store.js';
import { Watching } from './watching.js';

export interface SqliteStoreOptions {
  /** The database file; its directory is created 0700 when missing. */
  path: string;
  /** How often watchers poll the change marker. Default 250 ms. */
  pollMs?: number;
  /** How long a write waits for another process's write lock. Default 5 s. */
  busyTimeoutMs?: number;
  /** Timestamps and the watch poll. Default systemClock. */
  clock?: Clock;
  logger?: Logger;
}

export const SQLITE_POLL_MS = 250;
const BUSY_TIMEOUT_MS = 5_000; // 5 s

interface Migration {
  version: number;
  name: string;
  up: (db: Database.Database) => void;
}

const MIGRATIONS: Migration[] = [
  {
    version: 1,
    name: 'proxy_state',
    up: (db) => {
      db.exec(`
        CREATE TABLE proxy_state (
          id INTEGER PRIMARY KEY CHECK (id = 1),
          generation INTEGER NOT NULL CHECK (generation >= 0),
          document TEXT NOT NULL,
          hash TEXT,
          updated_at TEXT
        );
        CREATE TRIGGER proxy_state_generation_increases BEFORE UPDATE ON proxy_state
        WHEN NEW.generation <= OLD.generation
        BEGIN SELECT RAISE(ABORT, 'proxy_state.generation must increase on every update'); END;
      `);
      const empty = emptyState();
      db.prepare('INSERT INTO proxy_state (id, generation, document, hash, updated_at) VALUES (1, 0, ?, ?, NULL)').run(
        documentJson(empty),
        hashSpec(empty),
      );
    },
  },
];

export async function openSqliteStore(options: SqliteStoreOptions): Promise<WatchedStateStore> {
  if (!options.path) throw new ProxyError('DP_ERR_BAD_OPTION', 'path is required');
  const pollMs = options.pollMs ?? SQLITE_POLL_MS;
  if (!(pollMs > 0)) throw new ProxyError('DP_ERR_BAD_OPTION', `pollMs must be positive, got ${pollMs}`);
  const file = path.resolve(options.path);
  const dir = path.dirname(file);
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: 0o700 });
  // Create the file ourselves so it is 0600 from the first byte, whatever the umask.
  closeSync(openSync(file, 'a', 0o600));
  chmodSync(file, 0o600);
  let db: Database.Database;
  try {
    db = new Database(file);
    db.pragma('journal_mode = WAL');
    db.pragma(`busy_timeout = ${options.busyTimeoutMs ?? BUSY_TIMEOUT_MS}`);
    db.pragma('synchronous = FULL'); // a 200 to a PUT means the generation survives a power cut
    migrate(db);
  } catch (err) {
    throw new ProxyError('DP_ERR_STATE_CORRUPT', `cannot open ${file}: ${(err as Error).message}`, { file }, { cause: err });
  }
  const store = new SqliteStore(db, file, pollMs, options);
  await store.read().catch(() => undefined); // an invalid row is reported by health(), not fatal
  return store;
}

function migrate(db: Database.Database): void {
  db.exec(`CREATE TABLE IF NOT EXISTS proxy_schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`);
  const run = db.transaction(() => {
    const row = db.prepare('SELECT MAX(version) AS v FROM proxy_schema_migrations').get() as { v: number | null };
    const current = row.v ?? 0;
    const known = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;
    if (current > known)
      throw new Error(`schema version ${current} is newer than this dstack-proxy knows (${known}); upgrade dstack-proxy`);
    for (const m of MIGRATIONS) {
      if (m.version <= current) continue;
      m.up(db);
      db.prepare('INSERT INTO proxy_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)').run(
        m.version,
        m.name,
        new Date().toISOString(),
      );
    }
  });
  run.immediate();
}

interface DbRow {
  generation: number;
  document: string;
  updated_at: string | null;
}

class SqliteStore implements WatchedStateStore {
  readonly kind = 'sqlite' as const;
  private readonly tracker: RowTracker;
  private readonly select: Database.Statement<[], DbRow>;
  private readonly update: Database.Statement<[number, string, string, string, number]>;
  private stopPolling: (() => void) | undefined;
  private dataVersion = -1;
  private readonly watching: Watching;
  private readonly clock: Clock;

  constructor(
    private readonly db: Database.Database,
    private readonly file: string,
    private readonly pollMs: number,
    options: SqliteStoreOptions,
  ) {
    this.clock = options.clock ?? systemClock;
    this.tracker = new RowTracker('sqlite', options.logger, this.clock);
    this.watching = new Watching(this.tracker, { start: () => this.startTimer(), stop: () => this.stopTimer() });
    this.select = db.prepare('SELECT generation, document, updated_at FROM proxy_state WHERE id = 1');
    this.update = db.prepare(
      'UPDATE proxy_state SET generation = ?, document = ?, hash = ?, updated_at = ? WHERE id = 1 AND generation = ?',
    );
  }

  async read(): Promise<StoredState> {
    this.refresh();
    const good = this.tracker.current;
    if (good) return good;
    throw new ProxyError('DP_ERR_STATE_CORRUPT', this.tracker.health().lastError?.message ?? `${this.file} has no valid document`, {
      file: this.file,
    });
  }

  async write(state: ProxyState, { ifMatch }: WriteOptions = {}): Promise<WriteResult> {
    const hash = hashSpec(state);
    const updatedAt = new Date(this.clock.now()).toISOString();
    const tx = this.db.transaction((): { written: number } | { unchanged: RawRow } => {
      const row = this.rawRow();
      if (ifMatch !== undefined && ifMatch !== row.generation) throw mismatch(ifMatch, row.generation);
      if (this.tracker.hashOf(row) === hash) return { unchanged: row };
      const generation = row.generation + 1;
      const info = this.update.run(generation, documentJson(state), hash, updatedAt, row.generation);
      // Unreachable under BEGIN IMMEDIATE; kept so the statement alone carries the contract.
      if (info.changes !== 1) throw mismatch(ifMatch ?? row.generation, row.generation);
      return { written: generation };
    });
    let outcome: { written: number } | { unchanged: RawRow };
    try {
      outcome = tx.immediate();
    } catch (err) {
      throw storageError(this.file, err);
    }
    if ('written' in outcome) {
      const stored: StoredState = { generation: outcome.written, hash, state, updatedAt };
      this.tracker.wrote(stored);
      return { ...stored, changed: true };
    }
    const row = outcome.unchanged;
    this.tracker.accept(row);
    // The row holds this very content (equal hash).
    return { generation: row.generation, hash, state, updatedAt: row.updatedAt, changed: false };
  }

  watch(listener: ChangeListener): () => void {
    return this.watching.watch(listener);
  }

  health(): StoreHealth {
    return this.tracker.health();
  }

  async close(): Promise<void> {
    if (await this.watching.close()) this.db.close();
  }

  private startTimer(): void {
    this.dataVersion = this.db.pragma('data_version', { simple: true }) as number;
    this.stopPolling = every(this.clock, this.pollMs, () => this.poll());
  }

  private poll(): void {
    try {
      const version = this.db.pragma('data_version', { simple: true }) as number;
      if (version === this.dataVersion) return;
      this.dataVersion = version;
      this.refresh();
    } catch (err) {
      this.tracker.markUnreachable(err);
    }
  }

  private refresh(): void {
    this.tracker.accept(this.rawRow());
  }

  private rawRow(): RawRow {
    const row = this.select.get();
    if (!row) throw new ProxyError('DP_ERR_STATE_CORRUPT', `${this.file}: the proxy_state row is missing`, { file: this.file });
    return { generation: row.generation, document: row.document, updatedAt: row.updated_at ?? '' };
  }

  private stopTimer(): void {
    this.stopPolling?.();
    this.stopPolling = undefined;
  }
}

/** SQLite refusing the write for want of space or permission: the operator can act on it. */
function storageError(file: string, err: unknown): unknown {
  const code = (err as { code?: unknown }).code;
  if (typeof code !== 'string' || !/^SQLITE_(FULL|READONLY|IOERR|CANTOPEN|PERM)/.test(code)) return err;
  return new ProxyError(
    'DP_ERR_STATE_WRITE',
    `cannot write ${file}: ${(err as Error).message} (${code}); nothing was stored and the previous generation is still served`,
    { file, errno: code },
    { cause: err },
  );
}
