// Two `server-proxy` processes (the built CLI, as an operator starts them) on one
// PostgreSQL of their own (a private postmaster: restarting it cannot disturb other test files),
// in front of a real HTTP replica. PostgreSQL is restarted, then stopped for a few seconds,
// mid-run: both processes keep serving the last good document, a write gets a clear 503 instead
// of hanging, the status says the store is unreachable, and once the database is back the next
// change — a PUT through the other process, or a direct UPDATE of the row as docs/database.md
// tells a control server to write it — is served by both.

import { mkdirSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { ensurePostgres, startPrivatePostgres, type PrivatePostgres } from '../helpers/postgres.js';
import { tmpDir } from '../helpers/tmp.js';
import { startServerProxyProcess, type ProxyProcess } from './cli-process.js';
import { directService, doc, send, type Reply } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

const havePostgres = await ensurePostgres();

/** Generous: a request that has not answered by then is hanging, not slow. */
const NO_HANG_MS = 20_000;

function startCli(db: string, stateDir: string): Promise<ProxyProcess> {
  return startServerProxyProcess(['--db', db, '--port', '0', '--api-port', '0', '--state-dir', stateDir]);
}

function withDeadline<T>(what: string, p: Promise<T>, ms = NO_HANG_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

interface StoreStatus {
  kind: string;
  generation: number | undefined;
  connected: boolean;
  lastError?: { reason: string; message: string };
}

describe.skipIf(!havePostgres)('two server-proxy processes across a PostgreSQL restart', () => {
  let server: PrivatePostgres | undefined;
  let replica: TestReplica | undefined;
  const procs: ProxyProcess[] = [];
  const dirs: (() => void)[] = [];
  let a: ProxyProcess;
  let b: ProxyProcess;

  beforeAll(async () => {
    server = await startPrivatePostgres();
    replica = await startReplica();
    const start = async (): Promise<ProxyProcess> => {
      const { dir, cleanup } = tmpDir('dp-sp-pgr-');
      dirs.push(cleanup);
      mkdirSync(`${dir}/state`);
      const p = await startCli(server!.connectionString, `${dir}/state`);
      procs.push(p);
      return p;
    };
    [a, b] = await Promise.all([start(), start()]); // both migrate at once, under the advisory lock
  }, 90_000);

  afterAll(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await replica?.close();
    await server?.destroy();
    for (const c of dirs) c();
  });

  const alive = (): void => {
    for (const [name, p] of [
      ['A', a],
      ['B', b],
    ] as const) {
      if (p.child.exitCode !== null || p.child.signalCode !== null) {
        throw new Error(`server-proxy ${name} died (${p.child.exitCode ?? p.child.signalCode}):\n${p.output()}`);
      }
    }
  };
  const put = (url: string, services: Record<string, unknown>[]): Promise<Reply> =>
    withDeadline(
      `PUT ${url}/api/v1/state`,
      send(`${url}/api/v1/state`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(doc(services)) }),
    );
  const through = (p: ProxyProcess, run: string): Promise<Reply> =>
    withDeadline(`GET via ${p.url}`, send(`${p.url}/proxy/services/test-proj/${run}/echo`));
  const serves = (p: ProxyProcess, run: string, timeoutMs = 30_000): Promise<true> =>
    eventually(async () => ((await through(p, run)).status === 200 ? true : undefined), timeoutMs);
  const storeStatus = async (p: ProxyProcess): Promise<StoreStatus> => {
    const r = await withDeadline(`GET ${p.apiUrl}/api/v1/status`, send(`${p.apiUrl}/api/v1/status`));
    expect(r.status).toBe(200);
    return r.json<{ store: StoreStatus }>().store;
  };
  const servedGeneration = async (p: ProxyProcess): Promise<number> => {
    const r = await withDeadline(`GET ${p.apiUrl}/api/v1/state`, send(`${p.apiUrl}/api/v1/state`));
    expect(r.status).toBe(200);
    return r.json<{ metadata: { generation: number } }>().metadata.generation;
  };
  /** Retried only while the database is still coming back (503); anything else fails at once. */
  const putWhenBack = (url: string, services: Record<string, unknown>[]): Promise<number> =>
    eventually(async () => {
      const r = await put(url, services);
      if (r.status === 503) return undefined;
      expect(r.status, r.body.toString()).toBe(200);
      return r.json<{ generation: number }>().generation;
    }, 30_000);

  let services: Record<string, unknown>[] = [];
  const add = (run: string): Record<string, unknown>[] => (services = [...services, directService('test-proj', run, replica!.port)]);

  it('a PUT to A is served by B', async () => {
    const r = await put(a.apiUrl!, add('first'));
    expect(r.status, r.body.toString()).toBe(200);
    await serves(b, 'first', 5_000);
    expect(await storeStatus(b)).toMatchObject({ kind: 'postgres', connected: true });
  });

  it('pg_ctl restart: both keep serving, and the next PUT to B is served by A', async () => {
    await server!.restart();
    alive();
    for (const p of [a, b]) expect((await through(p, 'first')).status).toBe(200);
    const generation = await putWhenBack(b.apiUrl!, add('after-restart'));
    await serves(a, 'after-restart');
    await eventually(async () => ((await servedGeneration(a)) === generation ? true : undefined), 10_000);
    // Both are back on the database, with nothing left of the outage in their status.
    for (const p of [a, b]) {
      await eventually(async () => ((await storeStatus(p)).connected ? true : undefined), 30_000);
    }
    alive();
  }, 90_000);

  it('stopped for a few seconds: last good document served, writes refused with 503, then a direct UPDATE and a PUT are picked up', async () => {
    const before = await servedGeneration(a);
    await server!.stop();

    // The LISTEN connection ends with the server: both report the store unreachable.
    for (const p of [a, b]) {
      const s = await eventually(async () => {
        const st = await storeStatus(p);
        return st.connected ? undefined : st;
      }, 30_000);
      expect(s.lastError?.reason).toBe('unreachable');
      expect(s.generation).toBe(before);
    }
    // Serving goes on from the last good document, and so does GET /api/v1/state.
    for (const p of [a, b]) {
      expect((await through(p, 'first')).status).toBe(200);
      expect((await through(p, 'after-restart')).status).toBe(200);
      expect(await servedGeneration(p)).toBe(before);
      expect((await withDeadline('readyz', send(`${p.url}/readyz`))).status).toBe(200);
    }
    // A write has nowhere to go: a clear 503, not a hang and not a 500.
    const refused = await put(a.apiUrl!, [...services, directService('test-proj', 'during-outage', replica!.port)]);
    expect(refused.status).toBe(503);
    expect(refused.json()).toMatchObject({ code: 'DP_ERR_STATE_UNAVAILABLE' });
    expect(refused.json<{ message: string }>().message).toMatch(/unreachable/);

    await new Promise((r) => setTimeout(r, 3_000)); // a few seconds down: the reconnect backoff grows meanwhile
    alive();
    for (const p of [a, b]) expect((await through(p, 'first')).status).toBe(200);
    await server!.start();

    // A control server writes the row itself, by the rules of docs/database.md.
    const direct = await eventually(async () => {
      const c = new pg.Client(server!.config); // a pg.Client cannot retry connect(): a new one each time
      try {
        await c.connect();
        return c;
      } catch (err) {
        await c.end().catch(() => undefined);
        throw err;
      }
    }, 30_000);
    let directGeneration: number;
    try {
      await direct.query('BEGIN');
      const { rows } = await direct.query<{ generation: string }>('SELECT generation FROM proxy_state WHERE id = 1 FOR UPDATE');
      const read = Number(rows[0]!.generation);
      directGeneration = read + 1;
      const { spec } = doc(add('direct'));
      const res = await direct.query(
        'UPDATE proxy_state SET generation = $1, document = $2::jsonb, hash = NULL, updated_at = now() WHERE id = 1 AND generation = $3',
        [directGeneration, JSON.stringify({ apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec }), read],
      );
      expect(res.rowCount).toBe(1);
      await direct.query('COMMIT');
    } finally {
      await direct.end();
    }
    for (const p of [a, b]) {
      await serves(p, 'direct');
      await eventually(async () => ((await servedGeneration(p)) === directGeneration ? true : undefined), 10_000);
      await eventually(async () => {
        const st = await storeStatus(p);
        return st.connected && st.lastError === undefined ? true : undefined;
      }, 30_000);
    }

    // And a PUT through B (based on the directly written generation) is served by A.
    const generation = await putWhenBack(b.apiUrl!, add('after-stop'));
    expect(generation).toBe(directGeneration + 1);
    await serves(a, 'after-stop');
    for (const p of [a, b]) expect((await through(p, 'first')).status).toBe(200);
    alive();
  }, 120_000);

  it('both stop cleanly on SIGTERM after all that', async () => {
    alive();
    expect(await a.stop()).toBe(0);
    expect(await b.stop()).toBe(0);
  });
});
