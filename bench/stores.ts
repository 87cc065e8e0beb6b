// P8: generation pickup — a write committed by one store instance → seen by another
// instance's watcher, p50/p99 over 100 changes, SQLite (data_version poll) and PostgreSQL
// (LISTEN/NOTIFY). Exported for bench/run.ts; `node dist/bench/stores.js` runs it alone.
// PostgreSQL: $DSTACK_PROXY_BENCH_PG (a connection string), else the local cluster, started
// if down, with a scratch database (as root over /var/run/postgresql, like the tests).

import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { emptyState, type ProxyState } from '../src/spec/index.js';
import { openPostgresStore } from '../src/state/postgres-store.js';
import { openSqliteStore } from '../src/state/sqlite-store.js';
import type { WatchedStateStore } from '../src/state/watched-store.js';
import type { Row } from './table.js';

const CHANGES = 100;
const TARGET_MS = 1_000;

export async function storeRows(changes = CHANGES): Promise<Row[]> {
  const rows: Row[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'dp-bench-stores-'));
  try {
    const file = join(dir, 'proxy.db');
    const sqlite = await pickup(() => openSqliteStore({ path: file }), changes);
    rows.push(...latencyRows('P8s', 'SQLite (250 ms data_version poll)', sqlite));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const pgDb = localPostgres();
  if (!pgDb) {
    rows.push({
      id: 'P8p',
      name: 'generation pickup, PostgreSQL',
      value: 0,
      unit: 'ms',
      note: 'skipped: no PostgreSQL (set DSTACK_PROXY_BENCH_PG)',
    });
    return rows;
  }
  try {
    const pgTimes = await pickup(() => openPostgresStore({ connectionString: pgDb.url }), changes);
    rows.push(...latencyRows('P8p', 'PostgreSQL (LISTEN/NOTIFY)', pgTimes));
  } finally {
    pgDb.drop();
  }
  return rows;
}

/** Commit → the other instance's listener, for `changes` sequential writes. */
async function pickup(open: () => Promise<WatchedStateStore>, changes: number): Promise<number[]> {
  const writer = await open();
  const watcher = await open();
  const times: number[] = [];
  const seenAt = new Map<number, number>();
  let wake: (() => void) | undefined;
  watcher.watch((s) => {
    seenAt.set(s.generation, performance.now());
    wake?.();
  });
  try {
    for (let i = 0; i < changes; i++) {
      const { generation } = await writer.write(variant(i));
      const committed = performance.now();
      const deadline = committed + 10_000;
      while (!seenAt.has(generation)) {
        if (performance.now() > deadline)
          throw new Error(`generation ${generation} not seen within 10 s: ${watcher.health().lastError?.message ?? 'no error'}`);
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, 100);
        });
      }
      // A NOTIFY can beat the COMMIT acknowledgement to this process: count that as 0.
      times.push(Math.max(0, seenAt.get(generation)! - committed));
      // Pickup ends on a poll tick: spread the next commit over the 250 ms poll period, else
      // SQLite's figure would be phase-locked to the pause.
      await new Promise((r) => setTimeout(r, (i * 97) % 250));
    }
  } finally {
    await watcher.close();
    await writer.close();
  }
  return times;
}

/** A 50-service document, one field changed per step. */
function variant(i: number): ProxyState {
  const state = emptyState();
  state.spec.projects = [{ name: 'bench' }];
  state.spec.services = Array.from({ length: 50 }, (_, n) => ({
    project: 'bench',
    run: `run-${n}`,
    https: false,
    auth: false,
    clientMaxBodySize: 10_000 + i,
    stripPrefix: true,
    rateLimits: [],
    replicas: [{ id: `r-${n}`, appPort: 8000, direct: { host: '127.0.0.1', port: 8000 } }],
  }));
  return state;
}

function latencyRows(id: string, what: string, times: number[]): Row[] {
  const p50 = percentile(times, 0.5);
  const p99 = percentile(times, 0.99);
  return [
    {
      id,
      name: `generation pickup p50, ${what}: commit → another instance's watcher (${times.length} changes)`,
      value: round(p50),
      unit: 'ms',
    },
    {
      id: `${id}99`,
      name: `generation pickup p99, ${what}`,
      value: round(p99),
      unit: 'ms',
      target: `≤ ${TARGET_MS} ms`,
      ok: p99 <= TARGET_MS,
      better: 'lower',
    },
  ];
}

function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)] ?? Number.NaN;
}

const round = (ms: number): number => Math.round(ms * 10) / 10;

export function localPostgres(): { url: string; drop: () => void } | undefined {
  const given = process.env.DSTACK_PROXY_BENCH_PG;
  if (given) return { url: given, drop: () => undefined };
  const ls = spawnSync('pg_lsclusters', ['-h'], { encoding: 'utf8' });
  const [version, name, , status] = (ls.stdout ?? '').trim().split('\n')[0]?.trim().split(/\s+/) ?? [];
  if (ls.status !== 0 || !version || !name) return undefined;
  if (!status?.startsWith('online')) spawnSync('pg_ctlcluster', [version, name, 'start']);
  const psql = (sql: string): boolean => spawnSync('su', ['postgres', '-c', `psql -qAtX -d postgres -c "${sql}"`]).status === 0;
  const deadline = Date.now() + 30_000;
  while (!psql('SELECT 1')) {
    if (Date.now() > deadline) return undefined;
    spawnSync('sleep', ['0.2']);
  }
  psql('DO \\$\\$BEGIN CREATE ROLE root LOGIN SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END\\$\\$');
  const db = `dp_bench_${process.pid}`;
  if (!psql(`CREATE DATABASE ${db} OWNER root`)) return undefined;
  return {
    url: `postgres://root@/${db}?host=%2Fvar%2Frun%2Fpostgresql`,
    drop: () => void psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`),
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { renderTable } = await import('./table.js');
  process.stdout.write(`${renderTable(await storeRows())}\n`);
}
