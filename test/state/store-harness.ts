// One harness per store kind for the contract suite: open instances on the same storage and
// write a document straight into storage, as a control server in another language would.

import { writeFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import pg from 'pg';
import { hashSpec, validate } from '../../src/spec/index.js';
import { STATE_FILE } from '../../src/state/file-store.js';
import { openPostgresStore } from '../../src/state/postgres-store.js';
import { openSqliteStore } from '../../src/state/sqlite-store.js';
import { openWatchedFileStore } from '../../src/state/watched-file-store.js';
import type { StoreKind, WatchedStateStore } from '../../src/state/watched-store.js';
import { createTestDatabase } from '../helpers/postgres.js';
import { tmpDir } from '../helpers/tmp.js';

export interface StoreHarness {
  kind: StoreKind;
  /** Several instances on the same storage may write concurrently (not so for state.json). */
  sharedWriters: boolean;
  open(): Promise<WatchedStateStore>;
  /** Write `document` (any JSON value) as `generation`, bypassing the store. */
  writeDirect(generation: number, document: unknown): Promise<void>;
  /** The SQLite file, for permission checks. */
  file?: string;
  cleanup(): Promise<void>;
}

export async function fileHarness(): Promise<StoreHarness> {
  const t = tmpDir();
  const stateDir = path.join(t.dir, 'state');
  return {
    kind: 'file',
    sharedWriters: false,
    open: () => openWatchedFileStore({ stateDir }),
    writeDirect: async (generation, document) => {
      const checked = validate(document);
      const hash = checked.ok ? hashSpec(checked.state) : 'not-a-valid-document';
      const doc = { ...(document as object), metadata: { generation, hash, updatedAt: new Date().toISOString() } };
      const temp = path.join(stateDir, `direct-${generation}.tmp`);
      writeFileSync(temp, JSON.stringify(doc), { mode: 0o600 });
      const { renameSync } = await import('node:fs');
      renameSync(temp, path.join(stateDir, STATE_FILE));
    },
    cleanup: async () => t.cleanup(),
  };
}

export async function sqliteHarness(): Promise<StoreHarness> {
  const t = tmpDir();
  const file = path.join(t.dir, 'db', 'proxy.db');
  return {
    kind: 'sqlite',
    sharedWriters: true,
    file,
    open: () => openSqliteStore({ path: file }),
    writeDirect: async (generation, document) => {
      const db = new Database(file);
      try {
        db.pragma('busy_timeout = 5000');
        db.prepare('UPDATE proxy_state SET generation = ?, document = ?, hash = NULL, updated_at = ? WHERE id = 1').run(
          generation,
          JSON.stringify(document),
          new Date().toISOString(),
        );
      } finally {
        db.close();
      }
    },
    cleanup: async () => t.cleanup(),
  };
}

export async function postgresHarness(): Promise<StoreHarness> {
  const db = await createTestDatabase('dp_contract');
  return {
    kind: 'postgres',
    sharedWriters: true,
    open: () => openPostgresStore({ config: db.config }),
    writeDirect: async (generation, document) => {
      const client = new pg.Client(db.config);
      await client.connect();
      try {
        await client.query('UPDATE proxy_state SET generation = $1, document = $2::jsonb, hash = NULL, updated_at = now() WHERE id = 1', [
          generation,
          JSON.stringify(document),
        ]);
      } finally {
        await client.end();
      }
    },
    cleanup: () => db.drop(),
  };
}
