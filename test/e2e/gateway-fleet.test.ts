// Several gateways on one PostgreSQL document (`gateway --db postgres://…`), each with its own
// private Nginx, state dir and ports on 127.0.0.1: a PUT to any of them, or a write straight
// into the database, is served by all of them; a gateway that joins later serves the current
// document from its start; and with the database stopped (a postmaster of the test's own) they
// go on serving what they have, refuse changes, a gateway restarted meanwhile serves its copy
// of the last document, and all catch up once the database is back.

import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore } from '../../src/state/open-store.js';
import { validate } from '../../src/spec/index.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePort } from '../helpers/ports.js';
import { createTestDatabase, startPrivatePostgres, type PrivatePostgres, type TestDatabase } from '../helpers/postgres.js';
import { call, directReplica, integrationDoc, startGatewayWith, type ServiceDoc } from './integration-harness.js';

let db: TestDatabase;
let echo: Server;
let echoPort: number;
const fleet: TestGateway[] = [];

beforeAll(async () => {
  db = await createTestDatabase('dp_fleet');
  echoPort = await freePort();
  echo = await startEcho('fleet', { port: echoPort });
  for (let i = 0; i < 3; i++) fleet.push(await startGatewayWith({ db: db.connectionString }));
}, 120_000);

afterAll(async () => {
  for (const g of fleet) await g.cleanup();
  if (echo) await close(echo);
  await db?.drop();
});

const service = (run: string): ServiceDoc => ({ run, domain: `${run}.gw.test`, replicas: [directReplica(`${run}-r0`, echoPort)] });

/** Until every gateway's Nginx answers `host` with the replica; the time it took, in ms. */
async function servedByAll(host: string, since: number): Promise<number> {
  await Promise.all(
    fleet.map((g) =>
      eventually(async () => ((await call({ port: g.httpPort, host }).catch(() => null))?.status === 200 ? true : undefined), 30_000),
    ),
  );
  return performance.now() - since;
}

describe('gateways sharing one PostgreSQL document', () => {
  it('serve a PUT made to any of them on every one', async () => {
    const t0 = performance.now();
    const r = await putState(fleet[0]!, integrationDoc({ services: [service('first')] }));
    expect(r.status, r.body).toBe(200);
    const first = await servedByAll('first.gw.test', t0);
    const t1 = performance.now();
    const r2 = await putState(fleet[2]!, integrationDoc({ services: [service('first'), service('second')] }));
    expect(r2.status, r2.body).toBe(200);
    const second = await servedByAll('second.gw.test', t1);
    console.log(`fleet of 3: a PUT served by all after ${first.toFixed(0)} ms and ${second.toFixed(0)} ms`);
    // Every gateway reports the same generation.
    const generations = await Promise.all(
      fleet.map(
        async (g) => ((await (await fetch(`http://127.0.0.1:${g.apiPort}/api/v1/status`)).json()) as { generation: number }).generation,
      ),
    );
    expect(new Set(generations).size).toBe(1);
  }, 90_000);

  it('serve a document written straight into the database', async () => {
    const store = await openStore(db.connectionString);
    try {
      const t0 = performance.now();
      const v = validate(integrationDoc({ services: [service('first'), service('second'), service('direct')] }));
      if (!v.ok) throw new Error(JSON.stringify(v.errors));
      await store.write(v.state);
      const ms = await servedByAll('direct.gw.test', t0);
      console.log(`fleet of 3: a write into the database served by all after ${ms.toFixed(0)} ms`);
    } finally {
      await store.close();
    }
  }, 60_000);

  it('a gateway that joins later serves the current document from its start', async () => {
    const late = await startGatewayWith({ db: db.connectionString });
    fleet.push(late);
    const r = await eventually(async () => {
      const x = await call({ port: late.httpPort, host: 'direct.gw.test' }).catch(() => null);
      return x?.status === 200 ? x : undefined;
    }, 30_000);
    expect(JSON.parse(r.body)).toMatchObject({ name: 'fleet' });
  }, 60_000);
});

describe('gateways while their database is down', () => {
  let pg: PrivatePostgres;
  const pair: TestGateway[] = [];

  beforeAll(async () => {
    pg = await startPrivatePostgres();
    for (let i = 0; i < 2; i++) pair.push(await startGatewayWith({ db: pg.connectionString }));
    const r = await putState(pair[0]!, integrationDoc({ services: [service('kept')] }));
    expect(r.status, r.body).toBe(200);
    for (const g of pair)
      await eventually(
        async () => ((await call({ port: g.httpPort, host: 'kept.gw.test' }).catch(() => null))?.status === 200 ? true : undefined),
        30_000,
      );
  }, 120_000);

  afterAll(async () => {
    // The restarted gateway shares the state dir of the second: closed before that is removed.
    for (const g of [...pair].reverse()) await g.cleanup();
    await pg?.destroy();
  });

  it('serve what they have, refuse changes, start from their copy, and take the next change once it is back', async () => {
    await pg.stop();
    const failed: string[] = [];
    let answered = 0;
    const until = performance.now() + OUTAGE_MS;
    while (performance.now() < until) {
      for (const g of pair) {
        const r = await call({ port: g.httpPort, host: 'kept.gw.test' }).catch((err: unknown) => ({ status: 0, body: String(err) }));
        if (r.status === 200) answered++;
        else failed.push(`${r.status} ${r.body.slice(0, 100)}`);
      }
      await new Promise((res) => setTimeout(res, 50));
    }
    expect(failed).toEqual([]);
    expect(answered).toBeGreaterThan(20);
    // A change while it is down is refused, not half made.
    const refused = await putState(pair[1]!, integrationDoc({ services: [service('kept'), service('during')] }));
    expect(refused.status, refused.body).toBe(503);

    // A gateway restarted while the database is down serves its copy of the last document.
    await pair[1]!.close();
    const again = await startGatewayWith({ db: pg.connectionString, stateDir: pair[1]!.stateDir });
    pair.push(again);
    await eventually(
      async () => ((await call({ port: again.httpPort, host: 'kept.gw.test' }).catch(() => null))?.status === 200 ? true : undefined),
      30_000,
    );
    expect((await putState(again, integrationDoc({ services: [service('kept'), service('during')] }))).status).toBe(503);

    await pg.start();
    const r = await eventually(async () => {
      const x = await putState(pair[0]!, integrationDoc({ services: [service('kept'), service('after')] }));
      return x.status === 200 ? x : undefined;
    }, 60_000);
    expect(r.status).toBe(200);
    for (const g of [pair[0]!, again]) {
      await eventually(
        async () => ((await call({ port: g.httpPort, host: 'after.gw.test' }).catch(() => null))?.status === 200 ? true : undefined),
        30_000,
      );
      expect((await call({ port: g.httpPort, host: 'during.gw.test' })).status).toBe(404);
    }
  }, 120_000);
});

/** How long the database stays down while the clients ask. */
const OUTAGE_MS = 30_000;
