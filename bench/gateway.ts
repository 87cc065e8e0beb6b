// Gateway rows on a real private Nginx (127.0.0.1, free ports): cold converge of 1,000
// services, an identical re-PUT, and a one-service change inside the 1,000.

import { readdirSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { mkdtempSync, rmSync } from 'node:fs';
import { pino } from 'pino';
import { startGateway, type Gateway } from '../src/daemon/gateway.js';
import { resolveOptions } from '../src/gateway/options.js';
import { generateDocument } from './generate.js';
import type { Row } from './table.js';

const SERVICES = 1_000;
/** dstack's gateway, measured on this kind of machine (issue text): 100 services → 34 s, 200 reloads. */
const PEER_100_SERVICES_S = 34;
const PEER_100_SERVICES_RELOADS = 200;

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A gateway with its private Nginx on free ports of 127.0.0.1, silent, with no resync pass
 * during a measurement. `flags` adds gateway options (e.g. `dstackCompat`).
 */
export async function startBenchGateway(
  stateDir: string,
  deps: Omit<NonNullable<Parameters<typeof startGateway>[1]>, 'logger'> = {},
  flags: Record<string, string> = {},
): Promise<{ gw: Gateway; httpPort: number; httpsPort: number }> {
  const [httpPort, httpsPort] = [await freePort(), await freePort()];
  const gw = await startGateway(
    resolveOptions({
      flags: {
        stateDir,
        apiPort: '0',
        httpPort: String(httpPort),
        httpsPort: String(httpsPort),
        listenHost: '127.0.0.1',
        resyncInterval: '3600',
        ...flags,
      },
    }),
    { logger: pino({ level: 'silent' }), ...deps },
  );
  return { gw, httpPort, httpsPort };
}

function get(port: number, host: string, agent: http.Agent): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
  });
}

async function put(apiUrl: string, doc: unknown): Promise<{ ms: number; body: { changed: boolean; generation: number } }> {
  const t = performance.now();
  const r = await fetch(`${apiUrl}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  const body = (await r.json()) as { changed: boolean; generation: number };
  if (!r.ok) throw new Error(`PUT failed: ${JSON.stringify(body).slice(0, 300)}`);
  return { ms: performance.now() - t, body };
}

function mtimes(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const name of readdirSync(dir)) out.set(name, statSync(path.join(dir, name)).mtimeMs);
  return out;
}

export async function gatewayRows(): Promise<Row[]> {
  const rows: Row[] = [];
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-'));
  const backend = http.createServer((_req, res) => res.end('ok')).listen(0, '127.0.0.1');
  await new Promise((r) => backend.once('listening', r));
  const backendPort = (backend.address() as net.AddressInfo).port;
  const { gw, httpPort } = await startBenchGateway(stateDir);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  try {
    const doc = generateDocument(SERVICES, 1, { direct: true });
    for (const s of doc.spec.services!) {
      s.auth = false;
      s.rateLimits = [];
      s.replicas![0]!.direct!.port = backendPort;
    }
    const hosts = doc.spec.services!.map((s) => s.domain!);

    // P3: cold converge.
    const reloads0 = gw.nginxStats.reloads;
    const t0 = performance.now();
    await put(gw.apiUrl, doc);
    // 16 checkers in parallel (as many as the agent's sockets), each polling its hosts until 200.
    let nextHost = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (nextHost < hosts.length) {
          const host = hosts[nextHost++]!;
          while ((await get(httpPort, host, agent)) !== 200) await new Promise((r) => setTimeout(r, 5));
        }
      }),
    );
    const convergeMs = performance.now() - t0;
    await gw.controller.whenIdle();
    const coldReloads = gw.nginxStats.reloads - reloads0;
    rows.push({
      id: 'P3',
      name: `cold converge of ${SERVICES} services: PUT → every host answers`,
      value: convergeMs / 1000,
      unit: 's',
      target: '≤ 5 s',
      ok: convergeMs <= 5000,
      baseline: { name: 'dstack, 100 services', value: PEER_100_SERVICES_S, measured: 'published' },
    });
    rows.push({
      id: 'P3r',
      name: `Nginx reloads for that converge`,
      value: coldReloads,
      unit: 'reloads',
      target: '≤ 2',
      ok: coldReloads <= 2,
      baseline: { name: 'dstack, 100 services', value: PEER_100_SERVICES_RELOADS, measured: 'published' },
    });

    // P2: identical re-PUT.
    const sites = path.join(gw.paths.confDir, 'sites');
    const before = mtimes(sites);
    const reloads1 = gw.nginxStats.reloads;
    const times: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await put(gw.apiUrl, doc);
      if (r.body.changed) throw new Error('identical PUT reported a change');
      times.push(r.ms);
    }
    await gw.controller.whenIdle();
    const after = mtimes(sites);
    const written = [...after].filter(([n, m]) => before.get(n) !== m).length;
    times.sort((a, b) => a - b);
    rows.push({
      id: 'P2',
      name: `identical PUT of the ${SERVICES}-service document (median of 5)`,
      value: times[2]!,
      unit: 'ms',
      note: 'dstack rejects an identical re-send',
    });
    rows.push({
      id: 'P2w',
      name: 'files written / reloads for the identical PUTs',
      value: written + gw.nginxStats.reloads - reloads1,
      unit: 'files+reloads',
      target: '0',
      ok: written + gw.nginxStats.reloads - reloads1 === 0,
    });

    // One service changed inside the 1,000.
    const changed = structuredClone(doc);
    changed.spec.services![500]!.clientMaxBodySize = 1024;
    const reloads2 = gw.nginxStats.reloads;
    const t1 = performance.now();
    await put(gw.apiUrl, changed);
    await gw.controller.whenIdle();
    const oneMs = performance.now() - t1;
    const oneReloads = gw.nginxStats.reloads - reloads2;
    const afterOne = mtimes(sites);
    const filesOne = [...afterOne].filter(([n, m]) => after.get(n) !== m).length;
    rows.push({
      id: 'P4',
      name: `one-service change in ${SERVICES}: PUT → applied and reloaded`,
      value: oneMs,
      unit: 'ms',
      note: `${filesOne} file(s) written`,
    });
    rows.push({ id: 'P4r', name: 'reloads for that change', value: oneReloads, unit: 'reloads', target: '1', ok: oneReloads === 1 });
  } finally {
    agent.destroy();
    await gw.close();
    backend.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
  return rows;
}
