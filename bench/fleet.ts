// Fleet rows: three gateways (private Nginx each, in this process) sharing one PostgreSQL
// document (`--db`), against one gateway on its own state.json as the baseline. Measured: from
// a PUT to one of them (in turn) until every gateway's Nginx answers the new host, and from a
// write straight into the database until they all do.

import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { API_VERSION, KIND, validate } from '../src/spec/index.js';
import { openStore } from '../src/state/open-store.js';
import { startBenchGateway } from './gateway.js';
import { localPostgres } from './stores.js';
import type { Row } from './table.js';

/** New services, one per measurement. */
const ROUNDS = 10;

type Bench = Awaited<ReturnType<typeof startBenchGateway>>;

export async function fleetRows(): Promise<Row[]> {
  const pg = localPostgres();
  if (!pg)
    return [
      {
        id: 'F1',
        name: 'a PUT served by 3 gateways on one PostgreSQL document',
        value: 0,
        unit: 'ms',
        note: 'skipped: no PostgreSQL (set DSTACK_PROXY_BENCH_PG)',
      },
    ];
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-fleet-'));
  // The Nginx workers (www-data) enter the worker dirs under it.
  chmodSync(dir, 0o711);
  const replica = http.createServer((_req, res) => res.end('ok'));
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  const replicaPort = (replica.address() as { port: number }).port;
  const started: Bench[] = [];
  try {
    const alone = await startBenchGateway(path.join(dir, 'alone'));
    started.push(alone);
    const fleet: Bench[] = [];
    for (let i = 0; i < 3; i++) fleet.push(await startBenchGateway(path.join(dir, `g${i}`), {}, { db: pg.url }));
    started.push(...fleet);

    const runs: string[] = [];
    const single: number[] = [];
    const shared: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      runs.push(`svc${i}`);
      single.push(await putUntilServed(alone, [alone], document(runs, replicaPort), `svc${i}.gw.test`));
      shared.push(await putUntilServed(fleet[i % 3]!, fleet, document(runs, replicaPort), `svc${i}.gw.test`));
    }
    const store = await openStore(pg.url);
    const direct: number[] = [];
    try {
      for (let i = ROUNDS; i < ROUNDS * 2; i++) {
        runs.push(`svc${i}`);
        const v = validate(document(runs, replicaPort));
        if (!v.ok) throw new Error(JSON.stringify(v.errors));
        const t = performance.now();
        await store.write(v.state);
        await servedByAll(fleet, `svc${i}.gw.test`);
        direct.push(performance.now() - t);
      }
    } finally {
      await store.close();
    }
    const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    const spread = (xs: number[]): string => `${Math.round(Math.min(...xs))}–${Math.round(Math.max(...xs))} ms`;
    return [
      {
        id: 'F1',
        name: `a PUT to one of 3 gateways sharing a PostgreSQL document, until all 3 serve the new host (median of ${ROUNDS})`,
        value: Math.round(median(shared)),
        unit: 'ms',
        target: '≤ 1000 ms',
        ok: median(shared) <= 1000,
        baseline: { name: 'one gateway on its own state.json, until it serves', value: Math.round(median(single)), measured: 'same run' },
        note: `fleet ${spread(shared)}; one gateway ${spread(single)}. dstack's server registers a service on each replica in turn, each a reload: about 340 ms a registration on one gateway (100 in 34 s), about 1 s for 3`,
      },
      {
        id: 'F1d',
        name: `a document written into the database, until all 3 gateways serve the new host (median of ${ROUNDS})`,
        value: Math.round(median(direct)),
        unit: 'ms',
        target: '≤ 1000 ms',
        ok: median(direct) <= 1000,
        note: spread(direct),
      },
    ];
  } finally {
    for (const g of started) await g.gw.close();
    replica.closeAllConnections();
    await new Promise((r) => replica.close(r));
    pg.drop();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function putUntilServed(to: Bench, all: Bench[], doc: unknown, host: string): Promise<number> {
  const t = performance.now();
  const r = await fetch(`${to.gw.apiUrl}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  if (!r.ok) throw new Error(`PUT answered ${r.status}: ${(await r.text()).slice(0, 300)}`);
  await servedByAll(all, host);
  return performance.now() - t;
}

async function servedByAll(all: Bench[], host: string): Promise<void> {
  const deadline = performance.now() + 30_000;
  for (const g of all) {
    while ((await status(g.httpPort, host)) !== 200) {
      if (performance.now() > deadline) throw new Error(`${host} not served within 30 s`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }
}

function status(port: number, host: string): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
  });
}

function document(runs: string[], replicaPort: number): unknown {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      projects: [{ name: 'main' }],
      services: runs.map((run) => ({
        project: 'main',
        run,
        domain: `${run}.gw.test`,
        https: false,
        auth: false,
        replicas: [{ id: `${run}-r0`, appPort: replicaPort, direct: { host: '127.0.0.1', port: replicaPort } }],
      })),
    },
  };
}
