// Removal rows on a real private Nginx (127.0.0.1, free ports, the default 30 s drain period):
// services that have had keep-alive traffic (Nginx pools upstream connections to their balancer
// sockets) are removed one PUT at a time. Measured: PUT → the removed host answers 404, a
// service added in the PUT right after a removal answering, and 100 removals in a row (then
// 100 more, each waited for until Nginx reloaded without its site: the baseline); plus the
// `connect() … failed` lines Nginx logged meanwhile (a request routed to a closed socket).

import { readFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { mkdtempSync, rmSync } from 'node:fs';
import { API_VERSION, KIND } from '../src/spec/index.js';
import { startBenchGateway } from './gateway.js';
import type { Row } from './table.js';

const REMOVALS = 100;
/** dstack's gateway on the same machine, side by side: 0.017 s per removal. */
const PEER_REMOVAL_S = 0.017;

function get(port: number, host: string): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
  });
}

async function until(port: number, host: string, status: number, limitMs: number): Promise<void> {
  const end = performance.now() + limitMs;
  while ((await get(port, host)) !== status) {
    if (performance.now() > end) throw new Error(`${host} did not answer ${status} within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

interface Removals {
  oneMs: number;
  addedMs: number;
  hundredS: number;
  /** The same, each waited for until Nginx reloaded without the site. */
  hundredAtReloadS: number;
  reloads: number;
  passes: number;
  failures: number;
}

export async function removalRows(): Promise<Row[]> {
  const r = await removals(undefined, true);
  // The same with the reload interval off (a reload per pass): what the removals cost apart
  // from waiting for the interval.
  const off = await removals(0, false);
  return [
    {
      id: 'R1',
      name: 'one removal of a service with pooled connections: PUT → its host answers 404',
      value: r.oneMs / 1000,
      unit: 's',
      target: '≤ 1 s',
      ok: r.oneMs <= 1000,
      baseline: { name: 'dstack', value: PEER_REMOVAL_S, measured: 'published' },
    },
    {
      id: 'R1a',
      name: 'a service added in the PUT after that removal: removal PUT → it answers',
      value: r.addedMs / 1000,
      unit: 's',
      target: '≤ 1 s',
      ok: r.addedMs <= 1000,
    },
    // A removed service is answered as removed by the data plane from the pass that retires it;
    // the reload that drops its site follows, at most once a second.
    {
      id: 'R100',
      name: `${REMOVALS} removals one PUT at a time, each waited for (PUT → its host answers 404)`,
      value: r.hundredS,
      unit: 's',
      target: '≤ 30 s',
      ok: r.hundredS <= 30,
      baseline: { name: 'each waited for until Nginx reloaded without its site', value: r.hundredAtReloadS, measured: 'same run' },
      note: `dstack's gateway (published): ${(PEER_REMOVAL_S * REMOVALS).toFixed(1)} s`,
    },
    { id: 'R100r', name: `reloads during those ${REMOVALS} removals (at most one per second)`, value: r.reloads, unit: 'reloads' },
    { id: 'R100p', name: `Nginx loop passes during those ${REMOVALS} removals`, value: r.passes, unit: 'passes' },
    {
      id: 'R502',
      name: 'Nginx `connect() to unix:… failed` lines during those removals',
      value: r.failures,
      unit: 'lines',
      target: '0',
      ok: r.failures === 0,
    },
    {
      id: 'R100-0',
      name: `${REMOVALS} removals one PUT at a time, reload interval off (a reload per pass)`,
      value: off.hundredS,
      unit: 's',
    },
    { id: 'R100p-0', name: `Nginx loop passes during those ${REMOVALS} removals, reload interval off`, value: off.passes, unit: 'passes' },
    {
      id: 'R502-0',
      name: 'Nginx `connect() to unix:… failed` lines, reload interval off',
      value: off.failures,
      unit: 'lines',
      target: '0',
      ok: off.failures === 0,
    },
  ];
}

async function removals(minReloadIntervalMs: number | undefined, withBaseline: boolean): Promise<Removals> {
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-rm-'));
  const backend = http.createServer((_req, res) => res.end('ok'));
  backend.keepAliveTimeout = 120_000;
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  const backendPort = (backend.address() as net.AddressInfo).port;
  const { gw, httpPort } = await startBenchGateway(stateDir, {
    ...(minReloadIntervalMs !== undefined ? { nginxLoop: { minReloadIntervalMs } } : {}),
  });
  const svc = (run: string) => ({
    project: 'main',
    run,
    domain: `${run}.rm.test`,
    https: false,
    auth: false,
    replicas: [{ id: `${run}-r0`, appPort: backendPort, direct: { host: '127.0.0.1', port: backendPort } }],
  });
  const doc = (runs: string[]) => ({
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { projects: [{ name: 'main' }], services: runs.map(svc) },
  });
  const put = async (runs: string[]) => {
    const r = await fetch(`${gw.apiUrl}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(doc(runs)),
    });
    if (!r.ok) throw new Error(`PUT failed: ${(await r.text()).slice(0, 300)}`);
  };
  const errorLog = path.join(stateDir, 'nginx', 'logs', 'error.log');
  const connectFailures = (): number => {
    try {
      return readFileSync(errorLog, 'utf8')
        .split('\n')
        .filter((l) => /connect\(\) to unix:.* failed/.test(l)).length;
    } catch {
      return 0;
    }
  };
  try {
    const removed = withBaseline ? 2 * REMOVALS : REMOVALS;
    let runs = ['keep', ...Array.from({ length: removed + 1 }, (_, i) => `s${i}`)];
    await put(runs);
    // Traffic through every service, so Nginx holds pooled connections to every socket.
    for (const run of runs) {
      await until(httpPort, `${run}.rm.test`, 200, 30_000);
      for (let i = 0; i < 5; i++) await get(httpPort, `${run}.rm.test`);
    }
    const failures0 = connectFailures();

    // One removal, and a service added in the PUT right after it.
    const t0 = performance.now();
    runs = runs.filter((r) => r !== `s${removed}`);
    await put(runs);
    await until(httpPort, `s${removed}.rm.test`, 404, 120_000);
    const oneMs = performance.now() - t0;
    await put([...runs, 'added']);
    await until(httpPort, 'added.rm.test', 200, 120_000);
    const addedMs = performance.now() - t0;
    runs = [...runs, 'added'];

    // 100 removals, one PUT each, each waited for.
    const t1 = performance.now();
    const passes0 = gw.controller.counters()['nginx']?.passes ?? 0;
    const reloads0 = gw.nginxStats.reloads;
    for (let i = 0; i < REMOVALS; i++) {
      runs = runs.filter((r) => r !== `s${i}`);
      await put(runs);
      await until(httpPort, `s${i}.rm.test`, 404, 120_000);
    }
    const hundredS = (performance.now() - t1) / 1000;
    const passes = (gw.controller.counters()['nginx']?.passes ?? 0) - passes0;
    const reloads = gw.nginxStats.reloads - reloads0;
    const failures = connectFailures() - failures0;

    // The baseline: 100 more, each waited for until Nginx has reloaded without its site, which
    // is when a removed host answered 404 while a removed service's site kept serving it.
    const t2 = performance.now();
    for (let i = REMOVALS; i < removed; i++) {
      runs = runs.filter((r) => r !== `s${i}`);
      await put(runs);
      await nginxCaughtUp(gw.controller);
      await until(httpPort, `s${i}.rm.test`, 404, 120_000);
    }
    const hundredAtReloadS = withBaseline ? (performance.now() - t2) / 1000 : NaN;
    return { oneMs, addedMs, hundredS, hundredAtReloadS, reloads, passes, failures };
  } finally {
    await gw.close();
    backend.closeAllConnections();
    await new Promise((r) => backend.close(r));
    rmSync(stateDir, { recursive: true, force: true });
  }
}

/** The Nginx loop has finished a Ready pass of the newest generation. */
async function nginxCaughtUp(controller: Awaited<ReturnType<typeof startBenchGateway>>['gw']['controller']): Promise<void> {
  const gen = controller.statuses().generation;
  const end = performance.now() + 120_000;
  for (;;) {
    const ready = controller.statuses().loops['nginx']?.conditions.find((c) => c.type === 'Ready');
    if (ready?.status === 'True' && (ready.observedGeneration ?? -1) >= gen) return;
    if (performance.now() > end) throw new Error(`Nginx did not catch up with generation ${gen} within 120 s`);
    await new Promise((r) => setTimeout(r, 2));
  }
}
