// `--db` → a state store: `sqlite:PATH` (also sqlite:///abs/path), `postgres://…` /
// `postgresql://…`, or a state directory (`file:DIR` or a bare path) holding state.json.

import type { Logger } from 'pino';
import type { Clock } from '../clock.js';
import { ProxyError } from '../errors.js';
import { openPostgresStore, type PostgresStoreOptions } from './postgres-store.js';
import { openWatchedFileStore } from './watched-file-store.js';
import type { WatchedStateStore } from './watched-store.js';

export type StoreLocation =
  { kind: 'sqlite'; path: string } | { kind: 'postgres'; connectionString: string } | { kind: 'file'; stateDir: string };

export function parseStoreUrl(url: string): StoreLocation {
  const text = url.trim();
  if (!text) throw new ProxyError('DP_ERR_BAD_OPTION', 'the database URL is empty');
  if (/^sqlite:/i.test(text)) {
    let file = text.slice('sqlite:'.length);
    if (file.startsWith('//')) file = file.slice(2); // sqlite:///abs/path, sqlite://./rel
    if (!file) throw new ProxyError('DP_ERR_BAD_OPTION', `no file in ${url} (sqlite:PATH)`);
    return { kind: 'sqlite', path: file };
  }
  if (/^postgres(ql)?:\/\//i.test(text)) return { kind: 'postgres', connectionString: text };
  if (/^file:/i.test(text)) {
    const dir = text.slice('file:'.length).replace(/^\/\/(?=\/)/, '');
    if (!dir) throw new ProxyError('DP_ERR_BAD_OPTION', `no directory in ${url} (file:DIR)`);
    return { kind: 'file', stateDir: dir };
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `unsupported database URL ${redactStoreUrl(text)}: use sqlite:PATH, postgres://… or a state directory`,
    );
  }
  return { kind: 'file', stateDir: text };
}

export interface OpenStoreOptions {
  logger?: Logger;
  /** Timestamps and every timer of the store (polls, reconnect backoff). Default systemClock. */
  clock?: Clock;
  /** Watch poll interval for SQLite and state.json (default 250 ms); the safety-net poll for PostgreSQL (default 5 s). */
  pollMs?: number;
  /** Extra PostgreSQL settings (pool size, reconnect backoff, SSL via config). */
  postgres?: Omit<PostgresStoreOptions, 'connectionString' | 'logger' | 'clock' | 'pollMs'>;
}

export function openStore(url: string, options: OpenStoreOptions = {}): Promise<WatchedStateStore> {
  const where = parseStoreUrl(url);
  const common = {
    ...(options.logger ? { logger: options.logger } : {}),
    ...(options.clock ? { clock: options.clock } : {}),
    ...(options.pollMs ? { pollMs: options.pollMs } : {}),
  };
  switch (where.kind) {
    case 'sqlite':
      return openSqlite(where.path, common);
    case 'postgres':
      return openPostgresStore({ ...options.postgres, connectionString: where.connectionString, ...common });
    case 'file':
      return openWatchedFileStore({ stateDir: where.stateDir, ...common });
  }
}

// SQLite is an optional dependency: a gateway host installs without the native addon (no
// compiler, seconds instead of minutes), so it is loaded only when a sqlite: URL asks for it.
async function openSqlite(file: string, common: Omit<OpenStoreOptions, 'postgres'>): Promise<WatchedStateStore> {
  let module: typeof import('./sqlite-store.js');
  try {
    module = await import('./sqlite-store.js');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ERR_MODULE_NOT_FOUND') throw err;
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      'SQLite support is not installed (the optional dependency better-sqlite3); install it or use postgres:// or a state directory',
    );
  }
  return module.openSqliteStore({ path: file, ...common });
}

/** The URL with any password replaced, for logs and error messages. */
export function redactStoreUrl(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/[^:/@]*:)[^@/]*@/i, '$1***@');
}
