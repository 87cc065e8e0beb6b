// The shared state store: one row in PostgreSQL, for several proxy processes. Schema and the
// contract for a control server writing the row itself are in docs/database.md. Migrations run
// under an advisory lock, so processes starting together apply them once. Every committed
// change fires NOTIFY dstack_proxy_state (a trigger, so direct writers get it too); watchers
// LISTEN on a dedicated connection and also poll the generation every 5 s as a safety net.

import pg from 'pg';
import type { Logger } from 'pino';
import { every, systemClock, type Clock } from '../clock.js';
import { ProxyError } from '../errors.js';
import { emptyState, hashSpec, type ProxyState } from '../spec/index.js';
import { PgListener } from './postgres-listener.js';
import { mismatch } from './store.js';
import type { StoredState, WriteOptions, WriteResult } from './store.js';
import { RowTracker, documentJson, type ChangeListener, type RawRow, type StoreHealth, type WatchedStateStore } from './watched-store.js';
import { Watching } from './watching.js';

export const PG_CHANNEL = 'dstack_proxy_state';
export const PG_POLL_MS = 5_000; // 5 s safety net behind LISTEN/NOTIFY
export const PG_TIMEOUT_MS = 10_000; // 10 s: connect, and each query
const MIGRATION_LOCK = 'dstack_proxy_state_migrations'; // hashtext() of this is the advisory lock key

export interface PostgresStoreOptions {
  /** `postgres://user:pass@host:port/db`; or `config` for a socket, SSL options… */
  connectionString?: string;
  config?: pg.ClientConfig;
  /** Safety-net poll of the generation while watching. Default 5 s. */
  pollMs?: number;
  /** Connections for reads and writes. Default 4. */
  poolSize?: number;
  /**
   * Opening a connection, and waiting for a query's answer; past it the database counts as
   * unreachable (a partition keeps TCP up and silent: without it a PUT or GET would hang).
   * Default 10 s. `?query_timeout=MS` in the URL overrides the query part.
   */
  timeoutMs?: number;
  /** LISTEN reconnect backoff: first delay (default 100 ms), doubling up to maxDelayMs (default 5 s). */
  reconnect?: { initialDelayMs?: number; maxDelayMs?: number };
  /** Timestamps, the safety-net poll and the LISTEN reconnect backoff. Default systemClock. */
  clock?: Clock;
  logger?: Logger;
}

const MIGRATIONS: { version: number; name: string; statements: string[] }[] = [
  {
    version: 1,
    name: 'proxy_state',
    statements: [
      `CREATE TABLE proxy_state (
         id smallint PRIMARY KEY CHECK (id = 1),
         generation bigint NOT NULL CHECK (generation >= 0),
         document jsonb NOT NULL,
         hash text,
         updated_at timestamptz
       )`,
      `CREATE FUNCTION proxy_state_generation_increases() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         IF NEW.generation <= OLD.generation THEN
           RAISE EXCEPTION 'proxy_state.generation must increase on every update (was %, got %)', OLD.generation, NEW.generation;
         END IF;
         RETURN NEW;
       END $$`,
      `CREATE TRIGGER proxy_state_generation_increases BEFORE UPDATE ON proxy_state
       FOR EACH ROW EXECUTE FUNCTION proxy_state_generation_increases()`,
      `CREATE FUNCTION proxy_state_notify() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         PERFORM pg_notify('${PG_CHANNEL}', NEW.generation::text);
         RETURN NULL;
       END $$`,
      `CREATE TRIGGER proxy_state_notify AFTER INSERT OR UPDATE ON proxy_state
       FOR EACH ROW EXECUTE FUNCTION proxy_state_notify()`,
    ],
  },
];

export async function openPostgresStore(options: PostgresStoreOptions): Promise<WatchedStateStore> {
  if (!options.connectionString && !options.config) {
    throw new ProxyError('DP_ERR_BAD_OPTION', 'connectionString or config is required');
  }
  const config: pg.ClientConfig = {
    ...options.config,
    ...(options.connectionString ? { connectionString: options.connectionString } : {}),
  };
  const timeout = options.timeoutMs ?? PG_TIMEOUT_MS;
  const pool = new pg.Pool({ query_timeout: timeout, ...config, connectionTimeoutMillis: timeout, max: options.poolSize ?? 4 });
  const store = new PostgresStore(pool, config, options);
  try {
    await migrate(pool);
  } catch (err) {
    await pool.end().catch(() => undefined);
    // An unreachable server is not a corrupt store: the operator fixes the network, not the data.
    const code = isConnectionError(err) ? 'DP_ERR_STATE_UNAVAILABLE' : 'DP_ERR_STATE_CORRUPT';
    throw new ProxyError(code, `cannot prepare the PostgreSQL state store: ${(err as Error).message}`, {}, { cause: err });
  }
  await store.read().catch(() => undefined); // an invalid row is reported by health(), not fatal
  return store;
}

async function migrate(pool: pg.Pool): Promise<void> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query('SELECT pg_advisory_lock(hashtext($1))', [MIGRATION_LOCK]);
    try {
      await client.query(`CREATE TABLE IF NOT EXISTS proxy_schema_migrations (
        version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
      const { rows } = await client.query<{ v: number | null }>('SELECT MAX(version) AS v FROM proxy_schema_migrations');
      const current = rows[0]?.v ?? 0;
      const known = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;
      if (current > known)
        throw new ProxyError(
          'DP_ERR_STATE_CORRUPT',
          `schema version ${current} is newer than this dstack-proxy knows (${known}); upgrade dstack-proxy`,
        );
      for (const m of MIGRATIONS) {
        if (m.version <= current) continue;
        await client.query('BEGIN');
        try {
          for (const sql of m.statements) await client.query(sql);
          if (m.version === 1) {
            const empty = emptyState();
            await client.query('INSERT INTO proxy_state (id, generation, document, hash) VALUES (1, 0, $1::jsonb, $2)', [
              documentJson(empty),
              hashSpec(empty),
            ]);
          }
          await client.query('INSERT INTO proxy_schema_migrations (version, name) VALUES ($1, $2)', [m.version, m.name]);
          await client.query('COMMIT');
        } catch (err) {
          await client.query('ROLLBACK').catch(() => undefined);
          throw err;
        }
      }
    } finally {
      await client.query('SELECT pg_advisory_unlock(hashtext($1))', [MIGRATION_LOCK]).catch((err: Error) => (broken = err));
    }
  } finally {
    client.release(broken);
  }
}

interface DbRow {
  generation: string;
  document: unknown;
  updated_at: Date | null;
}

const SELECT_ROW = 'SELECT generation, document, updated_at FROM proxy_state WHERE id = 1';

class PostgresStore implements WatchedStateStore {
  readonly kind = 'postgres' as const;
  private readonly tracker: RowTracker;
  private listener: PgListener | undefined;
  private stopPolling: (() => void) | undefined;
  private refreshing: Promise<void> | undefined;
  private refreshAgain = false;
  private readonly watching: Watching;
  private readonly clock: Clock;

  constructor(
    private readonly pool: pg.Pool,
    private readonly config: pg.ClientConfig,
    private readonly options: PostgresStoreOptions,
  ) {
    this.clock = options.clock ?? systemClock;
    this.tracker = new RowTracker('postgres', options.logger, this.clock);
    this.watching = new Watching(this.tracker, { start: () => this.startWatching(), stop: () => this.stopWatching() });
    // An idle pooled connection dying (database restart) must not crash the process.
    pool.on('error', (err) => this.tracker.markUnreachable(err));
  }

  async read(): Promise<StoredState> {
    try {
      this.tracker.accept(await this.rawRow(this.pool));
    } catch (err) {
      if (!isConnectionError(err)) throw err;
      this.tracker.markUnreachable(err);
      const good = this.tracker.current;
      if (good) return good; // serving continues from the last good document
      throw unavailable(err);
    }
    const good = this.tracker.current;
    if (good) return good;
    throw new ProxyError('DP_ERR_STATE_CORRUPT', this.tracker.health().lastError?.message ?? 'proxy_state has no valid document');
  }

  async write(state: ProxyState, { ifMatch }: WriteOptions = {}): Promise<WriteResult> {
    const hash = hashSpec(state);
    const updatedAt = new Date(this.clock.now()).toISOString();
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      this.tracker.markUnreachable(err);
      throw unavailable(err);
    }
    let broken: Error | undefined;
    try {
      await client.query('BEGIN');
      // FOR UPDATE: concurrent writers queue here and each then sees the committed generation.
      const row = await this.rawRow(client, ' FOR UPDATE');
      if (ifMatch !== undefined && ifMatch !== row.generation) throw mismatch(ifMatch, row.generation);
      if (this.tracker.hashOf(row) === hash) {
        await client.query('COMMIT');
        this.tracker.accept(row);
        // The row holds this very content (equal hash).
        return { generation: row.generation, hash, state, updatedAt: row.updatedAt, changed: false };
      }
      const generation = row.generation + 1;
      const res = await client.query(
        'UPDATE proxy_state SET generation = $1, document = $2::jsonb, hash = $3, updated_at = $4 WHERE id = 1 AND generation = $5',
        [generation, documentJson(state), hash, updatedAt, row.generation],
      );
      if (res.rowCount !== 1) throw mismatch(ifMatch ?? row.generation, row.generation);
      await client.query('COMMIT'); // the trigger's NOTIFY is delivered now, with the commit
      const stored: StoredState = { generation, hash, state, updatedAt };
      this.tracker.wrote(stored);
      return { ...stored, changed: true };
    } catch (err) {
      if (isConnectionError(err)) {
        // No ROLLBACK on a dead or silent connection (it would wait out another timeout):
        // releasing it as broken closes it, and the server rolls back.
        broken = err as Error;
        this.tracker.markUnreachable(err);
        throw unavailable(err);
      }
      await client.query('ROLLBACK').catch((e: Error) => (broken = e));
      throw err;
    } finally {
      client.release(broken);
    }
  }

  watch(listener: ChangeListener): () => void {
    return this.watching.watch(listener);
  }

  health(): StoreHealth {
    return this.tracker.health();
  }

  async close(): Promise<void> {
    if (!(await this.watching.close())) return;
    await this.refreshing;
    await this.pool.end();
  }

  private startWatching(): void {
    this.listener = new PgListener({
      config: this.config,
      channel: PG_CHANNEL,
      initialDelayMs: this.options.reconnect?.initialDelayMs,
      maxDelayMs: this.options.reconnect?.maxDelayMs,
      clock: this.clock,
      onNotify: (payload) => {
        if (Number(payload) !== this.tracker.health().storedGeneration) this.refresh();
      },
      onConnected: () => this.refresh(), // catch up on anything committed while disconnected
      onLost: (err) => this.tracker.markUnreachable(err),
    });
    this.listener.start();
    this.stopPolling = every(this.clock, this.options.pollMs ?? PG_POLL_MS, () => this.poll());
  }

  private async stopWatching(): Promise<void> {
    this.stopPolling?.();
    this.stopPolling = undefined;
    const listener = this.listener;
    this.listener = undefined;
    await listener?.stop();
  }

  private poll(): void {
    this.pool.query<{ generation: string }>('SELECT generation FROM proxy_state WHERE id = 1').then(
      ({ rows }) => {
        if (Number(rows[0]?.generation) !== this.tracker.health().storedGeneration) this.refresh();
        else this.tracker.markConnected();
      },
      (err: unknown) => this.tracker.markUnreachable(err),
    );
  }

  /** One read at a time; a request during a read runs one more afterwards. */
  private refresh(): void {
    if (this.watching.closed) return;
    if (this.refreshing) {
      this.refreshAgain = true;
      return;
    }
    this.refreshing = this.read()
      .then(
        () => undefined,
        () => undefined, // recorded in health() by read()
      )
      .finally(() => {
        this.refreshing = undefined;
        if (this.refreshAgain) {
          this.refreshAgain = false;
          this.refresh();
        }
      });
  }

  private async rawRow(db: pg.Pool | pg.PoolClient, suffix = ''): Promise<RawRow> {
    const { rows } = await db.query<DbRow>(SELECT_ROW + suffix);
    const row = rows[0];
    if (!row) throw new ProxyError('DP_ERR_STATE_CORRUPT', 'the proxy_state row is missing');
    return { generation: Number(row.generation), document: row.document, updatedAt: row.updated_at?.toISOString() ?? '' };
  }
}

/** Connection-level failures (refused, reset, server shutting down) as opposed to SQL errors. */
function isConnectionError(err: unknown): boolean {
  if (err instanceof ProxyError) return false;
  const e = err as { code?: unknown; severity?: unknown };
  if (typeof e.severity === 'string' && typeof e.code === 'string') {
    return e.code.startsWith('08') || e.code.startsWith('57P'); // connection exception, operator intervention
  }
  return true;
}

function unavailable(err: unknown): ProxyError {
  return new ProxyError('DP_ERR_STATE_UNAVAILABLE', `the state database is unreachable: ${(err as Error).message}`, {}, { cause: err });
}
