// PostgreSQL specifics: migrations under an advisory lock, the NOTIFY trigger, and watchers
// surviving a database restart (on a private postmaster, so other test files are unaffected).

import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadDocument, type ProxyState } from '../../src/spec/index.js';
import { PG_CHANNEL, openPostgresStore } from '../../src/state/postgres-store.js';
import type { StoredState } from '../../src/state/store.js';
import type { WatchedStateStore } from '../../src/state/watched-store.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { startFrozenRelay } from '../helpers/frozen-relay.js';
import { eventually } from '../helpers/nginx.js';
import { createTestDatabase, ensurePostgres, startPrivatePostgres, type PrivatePostgres, type TestDatabase } from '../helpers/postgres.js';
import { turns, turnsUntil } from './turns.js';

const docA = loadDocument(readFileSync('examples/local-state.yaml', 'utf8'));
const variant = (i: number): ProxyState => ({
  ...docA,
  spec: { ...docA.spec, services: docA.spec.services.map((s) => ({ ...s, clientMaxBodySize: 1000 + i })) },
});

const havePostgres = await ensurePostgres();

describe.skipIf(!havePostgres)('PostgreSQL state store', () => {
  let db: TestDatabase;
  beforeAll(async () => {
    db = await createTestDatabase('dp_pgstore');
  });
  afterAll(async () => {
    await db?.drop();
  });

  it('runs migrations once when several processes start together', async () => {
    const fresh = await createTestDatabase('dp_pgmig');
    try {
      const stores = await Promise.all(Array.from({ length: 5 }, () => openPostgresStore({ config: fresh.config })));
      const client = new pg.Client(fresh.config);
      await client.connect();
      const { rows } = await client.query('SELECT version, name FROM proxy_schema_migrations');
      expect(rows).toEqual([{ version: 1, name: 'proxy_state' }]);
      await client.end();
      await Promise.all(stores.map((s) => s.close()));
    } finally {
      await fresh.drop();
    }
  });

  it('NOTIFYs the generation on every committed change, including direct updates', async () => {
    const store = await openPostgresStore({ connectionString: db.connectionString });
    const listener = new pg.Client(db.config);
    await listener.connect();
    const payloads: string[] = [];
    listener.on('notification', (m) => m.channel === PG_CHANNEL && payloads.push(m.payload ?? ''));
    await listener.query(`LISTEN ${PG_CHANNEL}`);
    const base = (await store.read()).generation;
    await store.write(variant(1));
    await listener.query('UPDATE proxy_state SET generation = generation + 1 WHERE id = 1');
    await eventually(() => (payloads.length >= 2 ? true : undefined));
    expect(payloads).toEqual([String(base + 1), String(base + 2)]);
    await expect(listener.query('UPDATE proxy_state SET hash = NULL WHERE id = 1')).rejects.toThrow(/generation must increase/);
    await listener.end();
    await store.close();
  });

  it('runs its safety-net poll on its clock: a change that sends no NOTIFY shows once pollMs has passed', async () => {
    const clock = new FakeClock();
    const pollMs = 60_000;
    const store = await openPostgresStore({ config: db.config, pollMs, clock });
    const direct = new pg.Client(db.config);
    await direct.connect();
    // A replica-role session fires no triggers: its updates send no NOTIFY, so only a read sees them.
    await direct.query('SET session_replication_role = replica');
    const silently = async (i: number): Promise<number> => {
      const { rows } = await direct.query<{ generation: string }>(
        'UPDATE proxy_state SET generation = generation + 1, document = $1::jsonb WHERE id = 1 RETURNING generation',
        [JSON.stringify({ apiVersion: docA.apiVersion, kind: docA.kind, spec: variant(i).spec })],
      );
      return Number(rows[0]!.generation);
    };
    try {
      const first = await silently(30);
      const seen: number[] = [];
      store.watch((s) => seen.push(s.generation));
      expect(clock.pendingTimers()).toBe(1);
      // The LISTEN connection's catch-up read finds `first`; after it, nothing reads until the poll.
      await turnsUntil(() => seen.includes(first), 'the catch-up read after LISTEN');
      const second = await silently(31);
      clock.advance(pollMs - 1);
      await turns();
      expect(seen).not.toContain(second);
      clock.advance(1);
      await turnsUntil(() => seen.includes(second), 'the poll sees the new generation');
    } finally {
      await direct.end();
      await store.close();
    }
    expect(clock.pendingTimers()).toBe(0);
  });

  describe('across a database restart', () => {
    let server: PrivatePostgres;
    const stores: WatchedStateStore[] = [];
    beforeAll(async () => {
      server = await startPrivatePostgres();
    }, 60_000);
    afterAll(async () => {
      await Promise.all(stores.map((s) => s.close()));
      await server?.destroy();
    });

    it('keeps serving the last good document while down and sees the next change once back', async () => {
      const reconnect = { initialDelayMs: 50, maxDelayMs: 500 };
      // A 60 s safety poll: within these deadlines only LISTEN (reconnected) can deliver changes.
      const watcher = await openPostgresStore({ config: server.config, reconnect, pollMs: 60_000 });
      const writer = await openPostgresStore({ config: server.config, reconnect });
      stores.push(watcher, writer);
      const seen: StoredState[] = [];
      watcher.watch((s) => seen.push(s));
      await writer.write(variant(1));
      await eventually(() => seen.find((s) => s.generation === 1));

      await server.stop();
      await eventually(() => (watcher.health().connected ? undefined : true));
      const during = await watcher.read();
      expect(during.generation).toBe(1);
      expect(watcher.health().lastError?.reason).toBe('unreachable');
      await expect(writer.write(variant(2))).rejects.toThrow(/unreachable/);

      await server.start();
      await eventually(async () => (await writer.write(variant(2)).catch(() => undefined)) ?? undefined, 30_000);
      const got = await eventually(() => seen.find((s) => s.generation === 2), 30_000);
      expect(got.state).toEqual(variant(2));
      expect(watcher.health()).toMatchObject({ connected: true, lastError: undefined });
      // Back on LISTEN: the next change arrives by NOTIFY.
      await writer.write(variant(3));
      await eventually(() => seen.find((s) => s.generation === 3), 10_000);
    }, 90_000);

    it('picks up a change made during a restart (pg_ctl restart -m fast)', async () => {
      const watcher = await openPostgresStore({
        config: server.config,
        reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
        pollMs: 60_000,
      });
      stores.push(watcher);
      const seen: StoredState[] = [];
      watcher.watch((s) => seen.push(s));
      const before = (await watcher.read()).generation;
      await server.restart();
      const direct = new pg.Client(server.config);
      await direct.connect();
      await direct.query('UPDATE proxy_state SET generation = generation + 1, document = $1::jsonb WHERE id = 1', [
        JSON.stringify({ apiVersion: docA.apiVersion, kind: docA.kind, spec: variant(9).spec }),
      ]);
      await direct.end();
      const got = await eventually(() => seen.find((s) => s.generation === before + 1), 30_000);
      expect(got.state.spec).toEqual(variant(9).spec);
    }, 90_000);

    it('answers within its timeout during a partition (TCP up, nothing coming back), and catches up after', async () => {
      const relay = await startFrozenRelay(`${server.config.host}/.s.PGSQL.${server.config.port}`);
      try {
        const config = { host: '127.0.0.1', port: relay.port, user: 'postgres', database: 'postgres' };
        const watcher = await openPostgresStore({ config, timeoutMs: 500, pollMs: 200 });
        const writer = await openPostgresStore({ config: server.config }); // not behind the relay
        stores.push(watcher, writer);
        const seen: StoredState[] = [];
        watcher.watch((s) => seen.push(s));
        const before = await watcher.read();

        relay.freeze();
        // Both a read and a write would wait forever on a silent connection; the timeout ends them.
        expect((await watcher.read()).generation).toBe(before.generation);
        expect(watcher.health()).toMatchObject({ connected: false, lastError: { reason: 'unreachable' } });
        await expect(watcher.write(variant(20))).rejects.toMatchObject({ code: 'DP_ERR_STATE_UNAVAILABLE' });
        const { generation } = await writer.write(variant(21)); // committed while the watcher cannot see it

        relay.thaw();
        const got = await eventually(() => seen.find((s) => s.generation === generation), 30_000);
        expect(got.state).toEqual(variant(21));
        await eventually(() => (watcher.health().connected ? true : undefined), 30_000);
        expect((await watcher.write(variant(22))).generation).toBe(generation + 1);
      } finally {
        await relay.close();
      }
    }, 90_000);
  });
});
