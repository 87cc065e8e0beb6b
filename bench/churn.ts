// Churn rows: a busy service under keep-alive clients while 60 services are added one PUT at a
// time (the way a control server registers replicas as they come up). Counts the reloads
// (from the loop's stats, as /metrics shows them) and the client requests that failed, for the
// Nginx loop as it is and with the reload interval off (a reload per pass, as before).
//
// `node dist/bench/churn.js` runs it alone and prints the failure kinds as well.

import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { mkdtempSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { API_VERSION, KIND } from '../src/spec/index.js';
import { startBenchGateway } from './gateway.js';
import type { Row } from './table.js';

const ADDED = 60;
/** Clients of the busy service, each a keep-alive connection sending request after request. */
const CLIENTS = 16;
/** Pause between two PUTs: 60 PUTs in ~13 s, as in the report that started this. */
const PUT_GAP_MS = 200;

interface ChurnResult {
  reloads: number;
  requests: number;
  failed: number;
  kinds: Record<string, number>;
  seconds: number;
}

function doc(backendPort: number, n: number): unknown {
  const svc = (run: string) => ({
    project: 'main',
    run,
    domain: `${run}.gw.test`,
    https: false,
    auth: false,
    replicas: [{ id: `${run}-r0`, appPort: backendPort, direct: { host: '127.0.0.1', port: backendPort } }],
  });
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { projects: [{ name: 'main' }], services: [svc('busy'), ...Array.from({ length: n }, (_, i) => svc(`added-${i}`))] },
  };
}

async function put(apiUrl: string, body: unknown): Promise<void> {
  const r = await fetch(`${apiUrl}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`PUT failed: ${r.status} ${(await r.text()).slice(0, 300)}`);
}

/** One client: a keep-alive agent with one socket, GET after GET until stop() is called. */
function client(port: number, stats: { requests: number; failed: number; kinds: Record<string, number> }): { stop: () => Promise<void> } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  let running = true;
  const one = (): Promise<void> =>
    new Promise((resolve) => {
      const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host: 'busy.gw.test' }, agent }, (res) => {
        res.resume();
        res.on('end', () => {
          stats.requests++;
          if (res.statusCode !== 200) {
            stats.failed++;
            stats.kinds[`HTTP ${res.statusCode}`] = (stats.kinds[`HTTP ${res.statusCode}`] ?? 0) + 1;
          }
          resolve();
        });
        res.on('error', () => resolve());
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        stats.requests++;
        stats.failed++;
        const kind = err.code ?? err.message;
        stats.kinds[kind] = (stats.kinds[kind] ?? 0) + 1;
        resolve();
      });
    });
  const loop = (async () => {
    while (running) await one();
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      agent.destroy();
    },
  };
}

export async function churn(minReloadIntervalMs: number | undefined): Promise<ChurnResult> {
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-churn-'));
  const backend = http.createServer((_req, res) => res.end('ok')).listen(0, '127.0.0.1');
  await new Promise((r) => backend.once('listening', r));
  const backendPort = (backend.address() as net.AddressInfo).port;
  const { gw, httpPort } = await startBenchGateway(stateDir, {
    ...(minReloadIntervalMs !== undefined ? { nginxLoop: { minReloadIntervalMs } } : {}),
  });
  try {
    await put(gw.apiUrl, doc(backendPort, 0));
    await gw.controller.whenIdle();
    const stats = { requests: 0, failed: 0, kinds: {} as Record<string, number> };
    const clients = Array.from({ length: CLIENTS }, () => client(httpPort, stats));
    await new Promise((r) => setTimeout(r, 500)); // warm: every client has its connection
    const reloads0 = gw.nginxStats.reloads;
    const t0 = performance.now();
    for (let n = 1; n <= ADDED; n++) {
      await put(gw.apiUrl, doc(backendPort, n));
      await new Promise((r) => setTimeout(r, PUT_GAP_MS));
    }
    await gw.controller.whenIdle();
    await new Promise((r) => setTimeout(r, 500));
    const seconds = (performance.now() - t0) / 1000;
    await Promise.all(clients.map((c) => c.stop()));
    return { reloads: gw.nginxStats.reloads - reloads0, requests: stats.requests, failed: stats.failed, kinds: stats.kinds, seconds };
  } finally {
    await gw.close();
    backend.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

export async function churnRows(): Promise<Row[]> {
  const before = await churn(0);
  const after = await churn(undefined);
  const perReload = (r: ChurnResult) => (r.reloads > 0 ? r.failed / r.reloads : 0);
  const kinds = (r: ChurnResult) =>
    Object.entries(r.kinds)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ') || 'none';
  return [
    {
      id: 'C1',
      name: `reloads while ${ADDED} services are added one PUT at a time (${PUT_GAP_MS} ms apart)`,
      value: after.reloads,
      unit: 'reloads',
      target: `≤ 1 per second (${Math.ceil(after.seconds)} s)`,
      ok: after.reloads <= Math.ceil(after.seconds) + 1,
      baseline: { name: 'no reload interval (a reload per pass)', value: before.reloads, measured: 'same run' },
      better: 'lower',
      note: `over ${after.seconds.toFixed(1)} s (no interval: ${before.seconds.toFixed(1)} s)`,
    },
    {
      id: 'C2',
      name: `failed requests of a busy service (${CLIENTS} keep-alive clients) during those PUTs`,
      value: after.failed,
      unit: 'requests',
      baseline: { name: 'no reload interval (a reload per pass)', value: before.failed, measured: 'same run' },
      better: 'lower',
      note: `of ${after.requests} (${kinds(after)}); no interval: ${before.failed} of ${before.requests} (${kinds(before)})`,
    },
    {
      id: 'C2r',
      name: 'failed requests per reload',
      value: perReload(after),
      unit: 'per reload',
      baseline: { name: 'no reload interval (a reload per pass)', value: perReload(before), measured: 'same run' },
      better: 'lower',
    },
  ];
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const mode = process.argv[2];
  const r = await churn(mode === 'per-change' ? 0 : undefined);
  process.stdout.write(`${JSON.stringify({ mode: mode ?? 'default', ...r, failedPerReload: r.reloads ? r.failed / r.reloads : 0 })}\n`);
}
