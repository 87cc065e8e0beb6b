// Scale rows on the built CLI (`dstack-proxy gateway`, a process of its own with its private
// Nginx, 127.0.0.1, free ports), as an operator runs it:
// - a cold converge of 10,000 services × 1 direct replica: PUT → every Host name gets its
//   replica's answer through Nginx, with the reloads it took, and what the check itself costs
//   on a gateway that has already converged;
// - the gateway's RSS after 1,000 PUTs that each add one service vs after one PUT of the same
//   1,000 services: two fresh gateways side by side, each collected (a full GC, through a
//   preload that answers SIGUSR2) before /proc/<pid>/status is read.
// The replica is one HTTP server in a process of its own, shared by every service; it answers
// with the Host it was asked for, so a check knows the request reached the right site.

import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { freePorts } from '../test/helpers/ports.js';
import { tmpDir } from '../test/helpers/tmp.js';
import { generateDocument } from './generate.js';
import { median, type Row } from './table.js';

const CLI = fileURLToPath(new URL('../src/cli.js', import.meta.url));
const GC_PRELOAD = fileURLToPath(new URL('./gc-preload.js', import.meta.url));

const CONVERGE_SERVICES = 10_000;
const MEMORY_SERVICES = 1_000;
/** Requests in flight while checking hosts (the checker is then not what the converge waits for). */
const CHECK_CONCURRENCY = 64;
/** Pause before asking a host again that does not answer yet (404 from the default server). */
const RETRY_MS = 50;
/** A cold converge still incomplete after this is reported as such (the row shows the limit). */
const CONVERGE_LIMIT_MS = 300_000;
/** After the last change: longer than the minimum interval between reloads plus a reload check. */
const SETTLE_MS = 4_000;

/** dstack's gateway, published figures: 100 services → 34 s and 200 reloads; 1,000 → 538 s and 2,000 reloads (extrapolated). */
const PEER_1000_SERVICES_S = 538;
const PEER_1000_SERVICES_RELOADS = 2_000;
/** dstack's gateway, published: 100 services in 34 s, the mean per service. */
const PEER_PER_SERVICE_MS = 340;
/** Services added one at a time to the converged gateway. */
const ONE_CHANGE_ROUNDS = 3;
/** dstack's gateway, measured side by side: 341 MiB after 1,000 one-service registrations, 170 MiB after one of 1,000. */
const PEER_RSS_ONE_BY_ONE_MIB = 341;
const PEER_RSS_AT_ONCE_MIB = 170;

const BACKEND = `
const http = require('node:http');
const srv = http.createServer((req, res) => res.end('replica ' + req.headers.host));
srv.keepAliveTimeout = 65000;
srv.listen(Number(process.argv[1]), '127.0.0.1', () => process.send && process.send('up'));
`;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

interface MemoryFigures {
  gc: boolean;
  rss: number;
  heapUsed: number;
  heapTotal: number;
  external: number;
  arrayBuffers: number;
}

interface ChildGateway {
  child: ChildProcess;
  apiUrl: string;
  httpPort: number;
  stateDir: string;
  output: () => string;
  /** A full GC in the gateway, then its memory figures (and VmRSS read from /proc right after). */
  collect: () => Promise<MemoryFigures & { vmRss: number; parts: ReturnType<typeof rssParts> }>;
  stop: () => Promise<void>;
}

async function startChildGateway(stateDir: string): Promise<ChildGateway> {
  const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
  const args = ['--expose-gc', '--import', GC_PRELOAD, CLI, 'gateway', '--state-dir', stateDir, '--api-port', String(apiPort)];
  args.push('--http-port', String(httpPort), '--https-port', String(httpsPort), '--listen-host', '127.0.0.1');
  args.push('--log-level', 'warn', '--resync-interval', '3600');
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const listeners = new Set<() => void>();
  const onData = (d: Buffer): void => {
    out += d.toString();
    for (const f of listeners) f();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const apiUrl = `http://127.0.0.1:${apiPort}`;
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await exited;
    clearTimeout(timer);
  };
  const collect = async (): Promise<MemoryFigures & { vmRss: number; parts: ReturnType<typeof rssParts> }> => {
    const from = out.length;
    const line = new Promise<MemoryFigures>((resolve, reject) => {
      const timer = setTimeout(() => done(() => reject(new Error('no memory figures from the gateway within 30 s'))), 30_000);
      const check = (): void => {
        const m = /bench-memory (\{.*\})\n/.exec(out.slice(from));
        if (m) done(() => resolve(JSON.parse(m[1]!) as MemoryFigures));
      };
      const done = (f: () => void): void => {
        clearTimeout(timer);
        listeners.delete(check);
        f();
      };
      listeners.add(check);
    });
    child.kill('SIGUSR2');
    const figures = await line;
    return { ...figures, vmRss: vmRss(child.pid!), parts: rssParts(child.pid!) };
  };
  const end = performance.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway exited ${child.exitCode}:\n${out.slice(-2000)}`);
    const r = await fetch(`${apiUrl}/readyz`).catch(() => null);
    if (r?.status === 200) break;
    if (performance.now() > end) {
      await stop();
      throw new Error(`gateway not ready within 60 s:\n${out.slice(-2000)}`);
    }
    await sleep(100);
  }
  return { child, apiUrl, httpPort, stateDir, output: () => out, collect, stop };
}

/** An error with what the gateway and its Nginx said last, for a check that failed. */
function explained(gw: ChildGateway, err: unknown): Error {
  let nginxLog = '';
  try {
    nginxLog = readFileSync(join(gw.stateDir, 'nginx', 'logs', 'error.log'), 'utf8')
      .split('\n')
      .slice(-15)
      .join('\n');
  } catch {
    // No log yet.
  }
  return new Error(`${(err as Error).message}\ngateway output:\n${gw.output().slice(-2000)}\nnginx error.log:\n${nginxLog}`);
}

/** Lines of the private Nginx's error log saying a worker ran out of connections. */
function workerConnectionAlerts(stateDir: string): number {
  try {
    const log = readFileSync(join(stateDir, 'nginx', 'logs', 'error.log'), 'utf8');
    return log.split('worker_connections are not enough').length - 1;
  } catch {
    return 0; // no log: nothing was said
  }
}

/** VmRSS of a process, bytes. */
function vmRss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

/**
 * Where a process's resident memory is, from /proc/<pid>/smaps: the brk heap (glibc's main
 * malloc arena), anonymous mappings (V8's heap pages, other malloc arenas and large blocks,
 * thread stacks) and file mappings (node and its libraries), bytes.
 */
function rssParts(pid: number): { brk: number; anon: number; file: number } {
  const out = { brk: 0, anon: 0, file: 0 };
  let kind: keyof typeof out = 'anon';
  for (const line of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
    const m = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ (\d+)\s*(.*)$/.exec(line);
    if (m) {
      const name = m[2]!;
      kind = name === '[heap]' ? 'brk' : m[1] !== '0' || name.startsWith('/') ? 'file' : 'anon';
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss) out[kind] += Number(rss[1]) * 1024;
  }
  return out;
}

/** The private Nginx of a gateway: master and workers (shared pages count in each), bytes. */
function nginxRss(stateDir: string): { bytes: number; processes: number } {
  const master = Number(readFileSync(join(stateDir, 'nginx', 'nginx.pid'), 'utf8').trim());
  const pids = [master];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      // Field 4 of /proc/<pid>/stat is the parent; the command name (field 2) may hold spaces.
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === master) pids.push(Number(name));
    } catch {
      // Gone meanwhile.
    }
  }
  let bytes = 0;
  for (const pid of pids) {
    try {
      bytes += vmRss(pid);
    } catch {
      // An old worker that finished meanwhile.
    }
  }
  return { bytes, processes: pids.length };
}

async function put(gw: ChildGateway, doc: unknown): Promise<{ generation: number; changed: boolean }> {
  const r = await fetch(`${gw.apiUrl}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`PUT failed (${r.status}): ${text.slice(0, 300)}`);
  return JSON.parse(text) as { generation: number; changed: boolean };
}

async function reloads(gw: ChildGateway): Promise<{ reloads: number; failures: number }> {
  const text = await (await fetch(`${gw.apiUrl}/metrics`)).text();
  const counter = (name: string): number => {
    const m = new RegExp(`^dstack_proxy_${name}(?:\\{[^}]*\\})? (\\d+)`, 'm').exec(text);
    if (!m) throw new Error(`no ${name} in /metrics`);
    return Number(m[1]);
  };
  return { reloads: counter('nginx_reloads_total'), failures: counter('nginx_reload_failures_total') };
}

/** Until every loop has acted on the stored generation, then SETTLE_MS more (a deferred reload would land in it). */
async function settle(gw: ChildGateway): Promise<void> {
  const end = performance.now() + 300_000;
  for (;;) {
    const s = (await (await fetch(`${gw.apiUrl}/api/v1/status`)).json()) as { generation: number; observedGeneration: number };
    if (s.observedGeneration >= s.generation) break;
    if (performance.now() > end) throw new Error(`gateway did not act on generation ${s.generation} within 300 s`);
    await sleep(100);
  }
  await sleep(SETTLE_MS);
}

interface Check {
  /** ms from `t0` until the first host answered as its replica, and until the last did (or the limit). */
  firstMs: number;
  allMs: number;
  /** Hosts that answered as their replica before the limit. */
  answered: number;
  /** Requests that did not get the replica's answer (not served yet, or a connection closed by a reload). */
  misses: number;
}

/**
 * Ask each host until it answers `replica <host>`; CHECK_CONCURRENCY requests in flight. Past
 * `limitMs` the hosts not asked yet are given up on and `answered` says how many made it.
 */
async function checkHosts(httpPort: number, hosts: string[], t0: number, limitMs: number): Promise<Check> {
  const pool = new Pool(`http://127.0.0.1:${httpPort}`, { connections: CHECK_CONCURRENCY, keepAliveTimeout: 60_000 });
  let firstMs = -1;
  let misses = 0;
  let done = 0;
  let next = 0;
  let last = '';
  let lastMiss = '';
  const answered = async (host: string): Promise<boolean> => {
    try {
      const r = await pool.request({ path: '/', method: 'GET', headers: { host } });
      const body = await r.body.text();
      if (r.statusCode === 200 && body === `replica ${host}`) return true;
      last = `${r.statusCode} ${body.slice(0, 200)}`;
    } catch (err) {
      last = String(err);
    }
    return false;
  };
  try {
    await Promise.all(
      Array.from({ length: CHECK_CONCURRENCY }, async () => {
        while (next < hosts.length) {
          const host = hosts[next++]!;
          let ok = false;
          while (!(ok = await answered(host))) {
            misses++;
            if (performance.now() - t0 > limitMs) break;
            await sleep(RETRY_MS);
          }
          if (!ok) {
            lastMiss = `${host}: ${last}`;
            continue;
          }
          done++;
          if (firstMs < 0) firstMs = performance.now() - t0;
        }
      }),
    );
  } finally {
    await pool.close();
  }
  if (done < hosts.length)
    process.stderr.write(`scale: ${hosts.length - done} host(s) did not answer within ${limitMs} ms, e.g. ${lastMiss.slice(0, 300)}\n`);
  return { firstMs, allMs: performance.now() - t0, answered: done, misses };
}

async function startBackend(): Promise<{ port: number; proc: ChildProcess }> {
  const [port] = (await freePorts(1)) as [number];
  const proc = spawn(process.execPath, ['-e', BACKEND, String(port)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  await new Promise((r) => proc.once('message', r));
  return { port, proc };
}

/** n services × 1 direct replica, all on the shared replica; no auth, no rate limits (one site per service, nothing else). */
function directDocument(n: number, backendPort: number): ReturnType<typeof generateDocument> {
  const doc = generateDocument(n, 1, { direct: true });
  for (const s of doc.spec.services!) {
    s.auth = false;
    s.rateLimits = [];
    s.replicas![0]!.direct!.port = backendPort;
  }
  return doc;
}

const MiB = 1024 * 1024;

export async function scaleRows(): Promise<Row[]> {
  const tmp = tmpDir('dp-bench-scale-');
  const backend = await startBackend();
  const gateways: ChildGateway[] = [];
  try {
    // DSTACK_PROXY_BENCH_SCALE=converge or =memory runs one half (the converge takes minutes).
    const only = process.env.DSTACK_PROXY_BENCH_SCALE;
    return [
      ...(only === 'memory' ? [] : await convergeRows(tmp.dir, backend.port, gateways)),
      ...(only === 'converge' ? [] : await memoryRows(tmp.dir, backend.port, gateways)),
    ];
  } finally {
    for (const gw of gateways) await gw.stop();
    backend.proc.kill('SIGKILL');
    tmp.cleanup();
  }
}

async function convergeRows(dir: string, backendPort: number, gateways: ChildGateway[]): Promise<Row[]> {
  const gw = await startChildGateway(join(dir, 'converge'));
  gateways.push(gw);
  const doc = directDocument(CONVERGE_SERVICES, backendPort);
  const hosts = doc.spec.services!.map((s) => s.domain!);
  const reloads0 = await reloads(gw);

  const t0 = performance.now();
  const putDone = put(gw, doc).then(() => performance.now() - t0);
  const [putMs, converged] = await Promise.all([putDone, checkHosts(gw.httpPort, hosts, t0, CONVERGE_LIMIT_MS)]).catch((err: unknown) => {
    throw explained(gw, err);
  });
  const complete = converged.answered === hosts.length;
  process.stderr.write(
    `scale: ${converged.answered} of ${CONVERGE_SERVICES} hosts answered after ${(converged.allMs / 1000).toFixed(1)} s\n`,
  );
  if (complete) await settle(gw);
  const reloads1 = await reloads(gw);
  const coldReloads = reloads1.reloads - reloads0.reloads;
  const failedReloads = reloads1.failures - reloads0.failures;

  // The same check on the converged gateway: what of the converge figure is the checking itself.
  const checks: number[] = [];
  const checkMisses: number[] = [];
  for (let i = 0; i < (complete ? 3 : 0); i++) {
    const t = performance.now();
    const c = await checkHosts(gw.httpPort, hosts, t, 300_000).catch((err: unknown) => {
      throw explained(gw, err);
    });
    checks.push(c.allMs);
    checkMisses.push(c.misses);
  }
  const checkMs = complete ? median(checks) : NaN;
  // One more service on the converged gateway, three times: PUT → its host answers.
  const adds: number[] = [];
  const addPuts: number[] = [];
  for (let i = 0; i < (complete ? ONE_CHANGE_ROUNDS : 0); i++) {
    const extra = structuredClone(doc.spec.services![0]!);
    extra.run = `extra-${i}`;
    extra.domain = `extra-${i}.gw.example.com`;
    extra.replicas![0]!.id = `extra-${i}`;
    doc.spec.services!.push(extra);
    await settle(gw);
    const t = performance.now();
    await put(gw, doc);
    addPuts.push(performance.now() - t);
    const c = await checkHosts(gw.httpPort, [extra.domain], t, 120_000).catch((err: unknown) => {
      throw explained(gw, err);
    });
    adds.push(c.allMs);
  }
  const alerts = workerConnectionAlerts(gw.stateDir);
  await gw.stop();

  const s = converged.allMs / 1000;
  const rows: Row[] = [
    {
      id: 'P3x',
      name: `cold converge of ${CONVERGE_SERVICES.toLocaleString('en-US')} services × 1 direct replica: PUT → every host answers`,
      value: s,
      unit: 's',
      target: '≤ 15 s',
      ok: complete && s <= 15,
      baseline: { name: 'dstack, 1,000 services', value: PEER_1000_SERVICES_S, measured: 'published' },
      note:
        (complete
          ? ''
          : `NOT CONVERGED: ${converged.answered} of ${CONVERGE_SERVICES} hosts answered within the ${CONVERGE_LIMIT_MS / 1000} s limit; `) +
        `PUT answered after ${(putMs / 1000).toFixed(1)} s, first host answered ${converged.firstMs < 0 ? 'never' : `after ${(converged.firstMs / 1000).toFixed(1)} s`}; ` +
        `${converged.misses} requests before the hosts answered (retried every ${RETRY_MS} ms, ${CHECK_CONCURRENCY} in flight); ` +
        `dstack: 100 services 34 s (published), 1,000 services extrapolated`,
    },
    {
      id: 'P3xr',
      name: 'Nginx reloads for that converge',
      value: coldReloads,
      unit: 'reloads',
      target: '1',
      ok: complete && coldReloads === 1,
      baseline: { name: 'dstack, 1,000 services', value: PEER_1000_SERVICES_RELOADS, measured: 'published' },
      note: `${failedReloads} failed reload(s) among them; dstack: 100 services 200 reloads (published), 1,000 services extrapolated`,
    },
  ];
  rows.push({
    id: 'P3xw',
    name: "Nginx's `worker_connections are not enough` alerts during that converge and the checks",
    value: alerts,
    unit: 'alerts',
    target: '0',
    ok: alerts === 0,
    note: `${CHECK_CONCURRENCY} client connections in flight to all ${CONVERGE_SERVICES.toLocaleString('en-US')} hosts`,
  });
  if (!complete) return rows;
  const addMs = median(adds);
  rows.push({
    id: 'P3x1',
    name: `one service added to the ${CONVERGE_SERVICES.toLocaleString('en-US')}: PUT → its host answers (median of ${ONE_CHANGE_ROUNDS})`,
    value: Math.round(addMs),
    unit: 'ms',
    target: '≤ 300 ms',
    ok: addMs <= 300,
    baseline: { name: 'dstack, per service (100 in 34 s)', value: PEER_PER_SERVICE_MS, measured: 'published' },
    note:
      `runs ${adds.map((a) => (a / 1000).toFixed(2)).join(' ')} s; the PUT of the whole document itself ${addPuts.map((a) => a.toFixed(0)).join(' ')} ms; ` +
      `the rest is the passes that give the data plane its host route and replica tunnel (the default server relays the host before the reload that brings its site in); ` +
      `dstack's figure is the mean at 100 services, not at ${CONVERGE_SERVICES.toLocaleString('en-US')}`,
  });
  rows.push({
    id: 'P3xc',
    name: `checking the ${CONVERGE_SERVICES.toLocaleString('en-US')} hosts on the converged gateway (part of P3x; median of 3)`,
    value: checkMs / 1000,
    unit: 's',
    note: `runs ${checks.map((c) => (c / 1000).toFixed(2)).join(' ')} s; requests that missed (retried) ${checkMisses.join(' ')}`,
  });
  return rows;
}

async function memoryRows(dir: string, backendPort: number, gateways: ChildGateway[]): Promise<Row[]> {
  const doc = directDocument(MEMORY_SERVICES, backendPort);
  const services = doc.spec.services!;
  const hosts = services.map((s) => s.domain!);
  // Two fresh gateways, alive together: the same document reached at once and one service at a time.
  const atOnce = await startChildGateway(join(dir, 'at-once'));
  gateways.push(atOnce);
  const oneByOne = await startChildGateway(join(dir, 'one-by-one'));
  gateways.push(oneByOne);
  const startRss = { atOnce: vmRss(atOnce.child.pid!), oneByOne: vmRss(oneByOne.child.pid!) };

  await put(atOnce, doc);
  const t = performance.now();
  for (let i = 1; i <= services.length; i++) await put(oneByOne, { ...doc, spec: { ...doc.spec, services: services.slice(0, i) } });
  const oneByOneS = (performance.now() - t) / 1000;
  for (const gw of [atOnce, oneByOne]) {
    await settle(gw);
    const c = await checkHosts(gw.httpPort, hosts, performance.now(), 60_000).catch((err: unknown) => {
      throw explained(gw, err);
    });
    if (c.misses > 0) throw new Error(`${c.misses} host(s) did not answer after the PUTs`);
  }
  // The checks opened pooled connections in both alike; let both sit, then collect and read.
  await sleep(SETTLE_MS);
  const settled = { atOnce: vmRss(atOnce.child.pid!), oneByOne: vmRss(oneByOne.child.pid!) };
  const a = await atOnce.collect();
  const b = await oneByOne.collect();
  const ngA = nginxRss(atOnce.stateDir);
  const ngB = nginxRss(oneByOne.stateDir);
  const ratio = b.vmRss / a.vmRss;
  const mib = (x: number): string => (x / MiB).toFixed(0);
  return [
    {
      id: 'P9m',
      name: `gateway RSS after ${MEMORY_SERVICES.toLocaleString('en-US')} PUTs adding one service each ÷ after one PUT of the same ${MEMORY_SERVICES.toLocaleString('en-US')}`,
      value: Math.round(ratio * 100) / 100,
      unit: '×',
      target: '≤ 1.3×',
      ok: ratio <= 1.3,
      baseline: { name: 'dstack', value: Math.round((PEER_RSS_ONE_BY_ONE_MIB / PEER_RSS_AT_ONCE_MIB) * 100) / 100, measured: 'published' },
      note:
        `after a full GC: one by one ${mib(b.vmRss)} MiB (V8 heap used/committed ${mib(b.heapUsed)}/${mib(b.heapTotal)}, external ${mib(b.external)}, array buffers ${mib(b.arrayBuffers)}), ` +
        `at once ${mib(a.vmRss)} MiB (${mib(a.heapUsed)}/${mib(a.heapTotal)}, ${mib(a.external)}, ${mib(a.arrayBuffers)}); ` +
        `by mapping (malloc brk heap / other anonymous / files) ${mib(b.parts.brk)}/${mib(b.parts.anon)}/${mib(b.parts.file)} vs ${mib(a.parts.brk)}/${mib(a.parts.anon)}/${mib(a.parts.file)} MiB; ` +
        `before the GC ${mib(settled.oneByOne)} vs ${mib(settled.atOnce)} MiB; at start ${mib(startRss.oneByOne)} vs ${mib(startRss.atOnce)} MiB; ` +
        `the 1,000 PUTs took ${oneByOneS.toFixed(0)} s; dstack ${PEER_RSS_ONE_BY_ONE_MIB} vs ${PEER_RSS_AT_ONCE_MIB} MiB`,
    },
    {
      id: 'P9m1',
      name: `gateway RSS after the ${MEMORY_SERVICES.toLocaleString('en-US')} one-service PUTs (after a full GC)`,
      value: Math.round(b.vmRss / MiB),
      unit: 'MiB',
      baseline: { name: 'dstack', value: PEER_RSS_ONE_BY_ONE_MIB, measured: 'published' },
    },
    {
      id: 'P9m0',
      name: `gateway RSS after one PUT of the ${MEMORY_SERVICES.toLocaleString('en-US')} services (after a full GC)`,
      value: Math.round(a.vmRss / MiB),
      unit: 'MiB',
      baseline: { name: 'dstack', value: PEER_RSS_AT_ONCE_MIB, measured: 'published' },
    },
    {
      id: 'P9mn',
      name: 'its private Nginx (master + workers, summed VmRSS), one by one / at once',
      value: Math.round(ngB.bytes / MiB),
      unit: 'MiB',
      note: `one by one ${mib(ngB.bytes)} MiB in ${ngB.processes} processes, at once ${mib(ngA.bytes)} MiB in ${ngA.processes}; not the gateway's memory`,
    },
  ];
}

// Run alone: node dist/bench/scale.js
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  scaleRows().then(
    (rows) => process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`),
    (err: unknown) => {
      process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
