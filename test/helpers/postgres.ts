// Real PostgreSQL for tests (the system's cluster, as Debian installs it), started if it is
// down, with a role `root` (peer auth over /var/run/postgresql) and a fresh database per test
// file. With CI=true a missing PostgreSQL fails the run instead of skipping.
// startPrivatePostgres() runs a separate postmaster in a scratch directory for tests that
// restart the server, so they cannot break other test files using the shared cluster.

import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type pg from 'pg';
import { freePort } from './ports.js';

const SOCKET_DIR = '/var/run/postgresql';

export interface TestDatabase {
  name: string;
  config: pg.ClientConfig;
  connectionString: string;
  drop(): Promise<void>;
}

interface Cluster {
  version: string;
  name: string;
  online: boolean;
}

function clusters(): Cluster[] | undefined {
  const r = spawnSync('pg_lsclusters', ['-h'], { encoding: 'utf8' });
  if (r.error || r.status !== 0) return undefined;
  return r.stdout
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => {
      const [version = '', name = '', , status = ''] = l.trim().split(/\s+/);
      return { version, name, online: status.startsWith('online') };
    });
}

function asPostgres(sql: string): { ok: boolean; out: string } {
  const r = spawnSync('su', ['postgres', '-c', `psql -qAtX -d postgres -c ${shellQuote(sql)}`], { encoding: 'utf8' });
  return { ok: r.status === 0, out: `${r.stdout}${r.stderr}`.trim() };
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

let ready: Promise<boolean> | undefined;

/** True when the shared cluster answers (started if needed); false to skip — never false in CI. */
export function ensurePostgres(): Promise<boolean> {
  ready ??= prepare();
  return ready;
}

async function prepare(): Promise<boolean> {
  const unavailable = (why: string): boolean => {
    if (process.env.CI === 'true') throw new Error(`PostgreSQL is required in CI: ${why}`);
    return false;
  };
  const list = clusters();
  const cluster = list?.[0];
  if (!cluster) return unavailable('pg_lsclusters found no cluster (install the postgresql package)');
  if (!cluster.online) {
    // Another test file may be starting it at the same moment: the loser's error is harmless.
    spawnSync('pg_ctlcluster', [cluster.version, cluster.name, 'start'], { encoding: 'utf8' });
  }
  const deadline = Date.now() + 30_000;
  while (!asPostgres('SELECT 1').ok) {
    if (Date.now() > deadline) return unavailable(`cluster ${cluster.version}/${cluster.name} did not start`);
    await new Promise((r) => setTimeout(r, 200));
  }
  if (asPostgres(`SELECT 1 FROM pg_roles WHERE rolname = 'root'`).out !== '1') {
    const created = asPostgres('CREATE ROLE root LOGIN SUPERUSER');
    if (!created.ok && !/already exists/.test(created.out)) return unavailable(`cannot create role root: ${created.out}`);
  }
  return true;
}

/** A new empty database owned by root on the shared cluster. */
export async function createTestDatabase(prefix = 'dp_test'): Promise<TestDatabase> {
  if (!(await ensurePostgres())) throw new Error('PostgreSQL is not available');
  const name = `${prefix}_${process.pid}_${Math.random().toString(36).slice(2, 8)}`;
  const r = asPostgres(`CREATE DATABASE ${name} OWNER root`);
  if (!r.ok) throw new Error(`cannot create database ${name}: ${r.out}`);
  return {
    name,
    config: { host: SOCKET_DIR, user: 'root', database: name },
    connectionString: `postgres://root@/${name}?host=${encodeURIComponent(SOCKET_DIR)}`,
    drop: async () => {
      asPostgres(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    },
  };
}

export interface PrivatePostgres {
  config: pg.ClientConfig;
  connectionString: string;
  /** `pg_ctl restart -m fast`: every connection is terminated, the server is back when this resolves. */
  restart(): Promise<void>;
  stop(): Promise<void>;
  start(): Promise<void>;
  /** Stop (if running) and remove the scratch directory. */
  destroy(): Promise<void>;
}

/** A postmaster of our own (initdb in a scratch directory, a free port, socket in that directory). */
export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  if (!(await ensurePostgres())) throw new Error('PostgreSQL is not available');
  const version = clusters()?.[0]?.version ?? '15';
  const bin = `/usr/lib/postgresql/${version}/bin`;
  if (!existsSync(`${bin}/initdb`)) throw new Error(`${bin}/initdb not found`);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dp-pg-'));
  chownSync(dir, uid('postgres'), gid('postgres'));
  const data = path.join(dir, 'data');
  const port = await freePort();
  const run = (args: string[]): void => {
    execFileSync('runuser', ['-u', 'postgres', '--', ...args], { stdio: 'pipe' });
  };
  run([`${bin}/initdb`, '-D', data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-sync']);
  const ctl = (action: string, ...extra: string[]): void =>
    run([`${bin}/pg_ctl`, '-D', data, '-l', path.join(dir, 'log'), '-w', '-t', '60', ...extra, action]);
  const opts = ['-o', `-p ${port} -k ${dir} -c listen_addresses='' -c fsync=off`];
  ctl('start', ...opts);
  return {
    config: { host: dir, port, user: 'postgres', database: 'postgres' },
    connectionString: `postgres://postgres@/postgres?host=${encodeURIComponent(dir)}&port=${port}`,
    restart: async () => ctl('restart', '-m', 'fast', ...opts),
    start: async () => ctl('start', ...opts),
    stop: async () => ctl('stop', '-m', 'fast'),
    destroy: async () => {
      try {
        ctl('stop', '-m', 'immediate');
      } catch {
        // already stopped
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

function uid(user: string): number {
  return Number(execFileSync('id', ['-u', user], { encoding: 'utf8' }).trim());
}

function gid(user: string): number {
  return Number(execFileSync('id', ['-g', user], { encoding: 'utf8' }).trim());
}
