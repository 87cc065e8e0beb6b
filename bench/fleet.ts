// Fleet rows: three gateways (private Nginx each, in this process) sharing one PostgreSQL
// document (`--db`), against one gateway on its own state.json as the baseline. Measured: from
// a PUT to one of them (in turn) until every gateway's Nginx answers the new host, and from a
// write straight into the database until they all do. Then certificates: from a PUT adding an
// https domain until all three present its certificate, with Pebble validating HTTP-01 through
// a front that sends each validation to a gateway that did not order; the baseline is one
// gateway ordering for itself from the same Pebble.

import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import os from 'node:os';
import path from 'node:path';
import { API_VERSION, KIND, validate } from '../src/spec/index.js';
import { openStore } from '../src/state/open-store.js';
import { startPebble, type TestPebble } from '../test/helpers/pebble.js';
import { freePort } from '../test/helpers/ports.js';
import { startBenchGateway } from './gateway.js';
import { localPostgres } from './stores.js';
import type { Row } from './table.js';

/** New services, one per measurement. */
const ROUNDS = 10;
/** New https domains, one per measurement. */
const TLS_ROUNDS = 3;

type Bench = Awaited<ReturnType<typeof startBenchGateway>> & { stateDir: string };

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
  let started: Bench[] = [];
  const fleet: Bench[] = [];
  let pebble: TestPebble | undefined;
  let front: ReturnType<typeof validationFront> | undefined;
  try {
    const start = async (stateDir: string, flags: Record<string, string>): Promise<Bench> => ({
      ...(await startBenchGateway(stateDir, {}, flags)),
      stateDir,
    });
    let alone = await start(path.join(dir, 'alone'), {});
    started.push(alone);
    for (let i = 0; i < 3; i++) fleet.push(await start(path.join(dir, `g${i}`), { db: pg.url }));
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
    // Certificates, on gateways of their own started with the ACME CA's bundle (the rows above
    // run without Pebble, as they always did): one gateway for itself, then the fleet.
    for (const g of started) await g.gw.close();
    started = [];
    fleet.length = 0;
    const frontPort = await freePort();
    pebble = await startPebble({ validateAt: frontPort });
    front = validationFront(frontPort, () => fleet);
    const acme = { acmeCaBundle: pebble.caPath, dnsPreflight: 'false', certbotTimeout: '120' };
    alone = await start(path.join(dir, 'tls-alone'), acme);
    started.push(alone);
    for (let i = 0; i < 3; i++) fleet.push(await start(path.join(dir, `tls-g${i}`), { db: pg.url, ...acme }));
    started.push(...fleet);
    const tlsAlone: number[] = [];
    const tlsFleet: number[] = [];
    const tlsRuns: string[] = [];
    for (let i = 0; i < TLS_ROUNDS; i++) {
      tlsRuns.push(`tls${i}`);
      front.only = alone;
      tlsAlone.push(await putUntilCertified(alone, [alone], document([], replicaPort, tlsRuns, pebble.directoryUrl), `tls${i}.gw.test`));
      front.only = null;
      const doc = document(runs, replicaPort, tlsRuns, pebble.directoryUrl);
      tlsFleet.push(await putUntilCertified(fleet[i % 3]!, fleet, doc, `tls${i}.gw.test`));
    }
    const orders = fleet.map((g) => certbotOrders(g.stateDir)).reduce((a, b) => a + b, 0);
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
      {
        id: 'F2',
        name: `a new https domain PUT to one of 3 gateways sharing PostgreSQL, until all 3 present its certificate (median of ${TLS_ROUNDS})`,
        value: Math.round(median(tlsFleet)),
        unit: 'ms',
        target: '≤ 2× one gateway ordering for itself',
        ok: median(tlsFleet) <= 2 * median(tlsAlone),
        baseline: {
          name: 'one gateway ordering for itself, until it presents it',
          value: Math.round(median(tlsAlone)),
          measured: 'same run',
        },
        note: `fleet ${spread(tlsFleet)}; one gateway ${spread(tlsAlone)}; ACME orders by the fleet: ${orders} for ${TLS_ROUNDS} domains (3 gateways each ordering for itself: ${3 * TLS_ROUNDS}). Pebble validates HTTP-01 through a front that picks a gateway that has not run certbot yet (else each in turn). dstack's replicated gateways cannot use Let's Encrypt at all`,
      },
    ];
  } finally {
    front?.server.close();
    await pebble?.destroy();
    for (const g of started) await g.gw.close();
    replica.closeAllConnections();
    await new Promise((r) => replica.close(r));
    pg.drop();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function putState(to: Bench, doc: unknown): Promise<void> {
  const r = await fetch(`${to.gw.apiUrl}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  if (!r.ok) throw new Error(`PUT answered ${r.status}: ${(await r.text()).slice(0, 300)}`);
}

async function putUntilServed(to: Bench, all: Bench[], doc: unknown, host: string): Promise<number> {
  const t = performance.now();
  await putState(to, doc);
  await servedByAll(all, host);
  return performance.now() - t;
}

/** Until every gateway presents a certificate for `host`, all with the same serial. */
async function putUntilCertified(to: Bench, all: Bench[], doc: unknown, host: string): Promise<number> {
  const t = performance.now();
  await putState(to, doc);
  const deadline = performance.now() + 120_000;
  const serials = new Set<string>();
  for (const g of all) {
    for (;;) {
      const serial = await presented(g.httpsPort, host);
      if (serial !== null) {
        serials.add(serial);
        break;
      }
      if (performance.now() > deadline) throw new Error(`no certificate for ${host} within 120 s`);
      await new Promise((res) => setTimeout(res, 20));
    }
  }
  if (serials.size !== 1) throw new Error(`the gateways present ${serials.size} certificates for ${host}`);
  return performance.now() - t;
}

/** The serial of the certificate presented for `host`, when it covers it; else null. */
function presented(port: number, host: string): Promise<string | null> {
  return new Promise((resolve) => {
    const s = tlsConnect({ host: '127.0.0.1', port, servername: host, rejectUnauthorized: false }, () => {
      const c = s.getPeerX509Certificate();
      s.destroy();
      resolve(c && c.checkHost(host) !== undefined ? c.serialNumber : null);
    });
    s.on('error', () => resolve(null));
  });
}

/** ACME orders certbot made for a gateway: its log files' "Requesting a certificate" lines. */
function certbotOrders(stateDir: string): number {
  const logs = path.join(stateDir, 'certbot', 'logs');
  let n = 0;
  for (const f of existsSync(logs) ? readdirSync(logs) : []) {
    n += readFileSync(path.join(logs, f), 'utf8')
      .split('\n')
      .filter((l) => l.includes('Requesting a certificate for')).length;
  }
  return n;
}

/** Pebble's validations: to `only` when set, else to a gateway of the fleet that has not run certbot. */
function validationFront(port: number, fleet: () => Bench[]): { server: net.Server; only: Bench | null } {
  const out: { server: net.Server; only: Bench | null } = { server: net.createServer(), only: null };
  let n = 0;
  out.server.on('connection', (client) => {
    const all = fleet();
    const target =
      out.only ?? all.find((g) => !existsSync(path.join(g.stateDir, 'certbot', 'logs', 'letsencrypt.log'))) ?? all[n++ % all.length];
    if (!target) return void client.destroy();
    const upstream = net.connect(target.httpPort, '127.0.0.1');
    client.pipe(upstream).pipe(client);
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  out.server.listen(port, '127.0.0.1');
  return out;
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

function document(runs: string[], replicaPort: number, httpsRuns: string[] = [], acmeServer?: string): unknown {
  const service = (run: string, https: boolean): unknown => ({
    project: 'main',
    run,
    domain: `${run}.gw.test`,
    https,
    auth: false,
    replicas: [{ id: `${run}-r0`, appPort: replicaPort, direct: { host: '127.0.0.1', port: replicaPort } }],
  });
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      ...(acmeServer ? { acme: { server: acmeServer } } : {}),
      projects: [{ name: 'main' }],
      services: [...runs.map((r) => service(r, false)), ...httpsRuns.map((r) => service(r, true))],
    },
  };
}
