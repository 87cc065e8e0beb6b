// The dstack compatibility routes driven as an unmodified dstack server drives its gateway: one
// call at a time, each answer awaited before the next call. For every service `services/register`
// (no https, no auth), then its `replicas/register` (one SSH replica: a loopback OpenSSH sshd that
// every replica shares, one HTTP app behind it); then the time until every service's Host answers
// 200 through Nginx. The project key is made as dstack makes it (RSA-2048, PKCS#8 PEM).
//
// Measured twice in the same run: as the gateway runs by default (reloads paced; the replicas,
// all behind the one sshd, share one SSH connection), and as dstack's gateway works: a reload per
// pass (dstack reloads on every change) and an SSH connection per replica (dstack runs an `ssh`
// per replica): the baseline. Replicas on as many different machines have nothing to share: a
// handshake each (40–100 ms with this sshd); DC2u measures ours that way.
// dstack's own gateway cannot run here (it installs from PyPI); its figures are the ones
// published for two machines of this kind.
//
// DC1: 100 services (both modes). DC2 + DC3: 1,000 services (both modes, and ours with a
// connection per replica: DC2u), and the per-call latencies of the paced run. DC2m: 1,000
// services with an OpenAI model (ours; `node dist/bench/compat.js 1000 ours model`). DC3sg: a
// services/register's p99 with the document held at 10 and at 1,000 services (both modes).
// DSTACK_PROXY_BENCH_ONLY=DC1* runs only the small one.
// `node dist/bench/compat.js [services] [unshared|as-dstack] [plain|model] [probe]` runs one round
// alone and prints its figures (probe: a request to each host right after its services/register
// answered, counting the 404s: services not reachable when their call answered); `node dist/bench/compat.js steady [as-dstack]` the DC3sg round.

import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { dstackProjectKey, registerServicePayload, vmReplicaPayload } from '../test/compat/dstack/fixtures.js';
import { startSshd, type TestSshd } from '../test/helpers/sshd.js';
import { tmpDir } from '../test/helpers/tmp.js';
import type { GatewayDeps } from '../src/daemon/gateway.js';
import { freePort, startBenchGateway } from './gateway.js';
import { percentile, wanted, type Row } from './table.js';

const PROJECT = 'bench';
/** dstack's server gives up on a gateway call after 120 s. */
const CALL_TIMEOUT_MS = 120_000;
/** After the last call, how long every Host may take to answer before the round fails. */
const ANSWER_DEADLINE_MS = 120_000;
/** Host checkers polling in parallel once the calls are done. */
const CHECKERS = 16;

/** dstack's gateway on two machines of this kind (published): seconds and reloads. */
const DSTACK = {
  100: { s: '17–34', reloads: 200 },
  1000: { s: '305–538', reloads: 2000 },
  /** p50 / p99 per call, ms, during the 1,000-service run. */
  serviceRegisterMs: { p50: 37, p99: 54 },
  replicaRegisterMs: { p50: 306, p99: 368 },
} as const;

interface Round {
  services: number;
  /** First call → last answer. */
  callsMs: number;
  /** First call → every Host answers 200 through Nginx. */
  totalMs: number;
  reloads: number;
  serviceMs: number[];
  replicaMs: number[];
  load: { start: number; end: number };
  /** With `probe`: hosts that answered 404 (not served) to a request sent right after their services/register answered. */
  unservedAfterAnswer?: number;
}

interface Fixture {
  /** The project key as dstack's server sends it in `ssh_private_key`. */
  projectKey: string;
  sshd: TestSshd;
  appPort: number;
  stop: () => Promise<void>;
}

/** The app every replica tunnels to: its own process, so the gateway's event loop is not shared with it. */
const APP = `
require('node:http').createServer((req, res) => { res.setHeader('content-type', 'text/plain'); res.end('ok'); })
  .listen(Number(process.argv[1]), '127.0.0.1', () => process.send && process.send('up'));
`;

async function startFixture(): Promise<Fixture> {
  const tmp = tmpDir('dp-bench-compat-');
  const procs: ChildProcess[] = [];
  try {
    const { privateKey, publicKey } = dstackProjectKey();
    const sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [publicKey] });
    const appPort = await freePort();
    const app = spawn(process.execPath, ['-e', APP, String(appPort)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    procs.push(app);
    await new Promise((r) => app.once('message', r));
    return {
      projectKey: privateKey,
      sshd,
      appPort,
      stop: async () => {
        for (const p of procs) p.kill();
        await sshd.stop();
        tmp.cleanup();
      },
    };
  } catch (err) {
    for (const p of procs) p.kill();
    tmp.cleanup();
    throw err;
  }
}

const runName = (i: number): string => `svc-${i}`;
const domainOf = (i: number): string => `${runName(i)}.bench.gw.test`;

/**
 * What is registered: `plain` services (no model, no https, no auth, no rate limits), which our
 * default server relays by Host until their own site is served; or services with an OpenAI
 * `model`, which need their own site (its CORS), so each services/register waits for a reload.
 */
type Kind = 'plain' | 'model';

/** `register_service`'s payload of a service of that kind (no auth: the hosts are polled without a token). */
function registerServiceBody(i: number, projectKey: string, kind: Kind): unknown {
  return registerServicePayload({
    runName: runName(i),
    domain: domainOf(i),
    project: PROJECT,
    https: false,
    auth: false,
    ...(kind === 'plain' ? { model: null } : {}),
    sshPrivateKey: projectKey,
    extra: {},
  });
}

/** `register_replica`'s payload for a job on a VM (not dockerized): `user@host` and the VM's sshd port. */
function registerReplicaBody(f: Fixture): unknown {
  return vmReplicaPayload({ appPort: f.appPort, user: f.sshd.user, host: '127.0.0.1', sshPort: f.sshd.port, extra: {} });
}

/** One call; the elapsed ms. Anything but 200 `{"status":"ok"}` ends the round: the server would have marked it failed. */
async function call(url: string, body: unknown): Promise<number> {
  const t = performance.now();
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
  });
  const text = await r.text();
  const ms = performance.now() - t;
  if (r.status !== 200) {
    const hint = r.status === 404 ? ' (are the dstack compatibility routes on? --dstack-compat true)' : '';
    throw new Error(`POST ${new URL(url).pathname}: ${r.status} ${text.slice(0, 300)}${hint}`);
  }
  return ms;
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

/** Every Host answers 200 through Nginx (CHECKERS in parallel, each polling its host until it does). */
async function allAnswer(httpPort: number, hosts: string[], deadline: number): Promise<void> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CHECKERS });
  let next = 0;
  const pending = new Set(hosts);
  try {
    await Promise.all(
      Array.from({ length: CHECKERS }, async () => {
        while (next < hosts.length) {
          const host = hosts[next++]!;
          while ((await get(httpPort, host, agent)) !== 200) {
            if (performance.now() > deadline)
              throw new Error(`${pending.size} of ${hosts.length} hosts still not answering 200 (e.g. ${host})`);
            await new Promise((r) => setTimeout(r, 5));
          }
          pending.delete(host);
        }
      }),
    );
  } finally {
    agent.destroy();
  }
}

/** One round: a fresh gateway, `services` services registered and answering, then closed. */
/** The gateway as it runs by default, or as dstack's works (a reload per pass, a connection per replica). */
/**
 * `unshared`: ours with a connection per replica, which is what replicas on as many different
 * machines get (nothing to share); the bench's replicas all sit behind one sshd.
 */
type Mode = 'ours' | 'unshared' | 'as-dstack';

function depsOf(mode: Mode): GatewayDeps {
  if (mode === 'as-dstack') return { nginxLoop: { minReloadIntervalMs: 0 }, ssh: { shareConnections: false } };
  return mode === 'unshared' ? { ssh: { shareConnections: false } } : {};
}

async function registerRound(f: Fixture, services: number, mode: Mode, kind: Kind = 'plain', probe = false): Promise<Round> {
  const tmp = tmpDir('dp-bench-compat-gw-');
  const { gw, httpPort } = await startBenchGateway(join(tmp.dir, 'state'), depsOf(mode), { dstackCompat: 'true' });
  try {
    const registry = `${gw.apiUrl}/api/registry/${PROJECT}/services`;
    const serviceMs: number[] = [];
    const replicaMs: number[] = [];
    const load0 = os.loadavg()[0]!;
    const reloads0 = gw.nginxStats.reloads;
    const t0 = performance.now();
    const probeAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    let unserved = 0;
    for (let i = 0; i < services; i++) {
      serviceMs.push(await call(`${registry}/register`, registerServiceBody(i, f.projectKey, kind)));
      // Reachable when the call answered? (503 without a replica yet; 404: Nginx knows no such host.)
      if (probe && (await get(httpPort, domainOf(i), probeAgent)) === 404) unserved++;
      replicaMs.push(await call(`${registry}/${runName(i)}/replicas/register`, registerReplicaBody(f)));
    }
    const callsMs = performance.now() - t0;
    probeAgent.destroy();
    await allAnswer(
      httpPort,
      Array.from({ length: services }, (_, i) => domainOf(i)),
      performance.now() + ANSWER_DEADLINE_MS,
    );
    const totalMs = performance.now() - t0;
    await gw.controller.whenIdle();
    return {
      services,
      callsMs,
      totalMs,
      reloads: gw.nginxStats.reloads - reloads0,
      serviceMs,
      replicaMs,
      load: { start: load0, end: os.loadavg()[0]! },
      ...(probe ? { unservedAfterAnswer: unserved } : {}),
    };
  } finally {
    await gw.close();
    tmp.cleanup();
  }
}

/** Calls measured at each size of a steady round, after as many untimed ones warm the JIT. */
const STEADY_CALLS = 500;
const STEADY_WARMUP = 50;

/** services/register latencies with the document held at each size, in ms. */
interface Steady {
  bySize: Map<number, number[]>;
}

/**
 * services/register of one more service, then its unregister, STEADY_CALLS times with the
 * document held at each size (services with one replica each, registered as DC2 does): the
 * latency of a register in a document of that size, from as many calls as a p99 needs. The
 * growth row compares the sizes; the sync's own first and last hundred calls mix in the
 * replicas still connecting.
 */
async function steadyRound(f: Fixture, sizes: number[], mode: Mode): Promise<Steady> {
  const tmp = tmpDir('dp-bench-compat-steady-');
  const { gw } = await startBenchGateway(join(tmp.dir, 'state'), depsOf(mode), { dstackCompat: 'true' });
  const bySize = new Map<number, number[]>();
  try {
    const registry = `${gw.apiUrl}/api/registry/${PROJECT}/services`;
    let registered = 0;
    for (const size of sizes) {
      for (; registered < size; registered++) {
        await call(`${registry}/register`, registerServiceBody(registered, f.projectKey, 'plain'));
        await call(`${registry}/${runName(registered)}/replicas/register`, registerReplicaBody(f));
      }
      await gw.controller.whenIdle();
      const ms: number[] = [];
      for (let k = 0; k < STEADY_WARMUP + STEADY_CALLS; k++) {
        const extra = size + 1 + k;
        const t = await call(`${registry}/register`, registerServiceBody(extra, f.projectKey, 'plain'));
        if (k >= STEADY_WARMUP) ms.push(t);
        await call(`${registry}/${runName(extra)}/unregister`, undefined);
      }
      bySize.set(size, ms);
    }
    await gw.controller.whenIdle();
    return { bySize };
  } finally {
    await gw.close();
    tmp.cleanup();
  }
}

const steadyGrowth = (s: Steady, small: number, large: number): number =>
  percentile(s.bySize.get(large)!, 99) / percentile(s.bySize.get(small)!, 99);

/** DC3sg: p99 of services/register at 1,000 services over p99 at 10, the document held at each size. */
function steadyGrowthRow(ours: Steady, asDstack: Steady): Row {
  const value = steadyGrowth(ours, 10, 1000);
  const p = (s: Steady, n: number, q: 50 | 99): string => percentile(s.bySize.get(n)!, q).toFixed(1);
  return {
    id: 'DC3sg',
    name: `services/register p99 at 1,000 services ÷ p99 at 10 services (${STEADY_CALLS} calls at each size, the document held there)`,
    value,
    unit: '×',
    target: '≤ 1.5×',
    ok: value <= 1.5,
    baseline: {
      name: 'as dstack: a reload per pass, an SSH connection per replica',
      value: steadyGrowth(asDstack, 10, 1000),
      measured: 'same run',
    },
    better: 'lower',
    note: `p50/p99 ${p(ours, 10, 50)}/${p(ours, 10, 99)} ms at 10 services, ${p(ours, 1000, 50)}/${p(ours, 1000, 99)} ms at 1,000 (as dstack: ${p(asDstack, 10, 99)} → ${p(asDstack, 1000, 99)} ms)`,
  };
}

const perSecond = (r: Round): number => r.reloads / (r.callsMs / 1000);
const loadNote = (r: Round): string => `${r.load.start.toFixed(2)} → ${r.load.end.toFixed(2)}`;

/** DC1/DC2 (time, reloads) for one size, ours against the unpaced baseline of the same run. */
function sizeRows(id: string, ours: Round, unpaced: Round, targetS: number): Row[] {
  const n = ours.services;
  const dstack = DSTACK[n as 100 | 1000];
  const baselineName = 'as dstack: a reload per pass, an SSH connection per replica';
  return [
    {
      id,
      name: `${n.toLocaleString('en-US')} services × 1 SSH replica (all on one sshd) through the dstack routes, one call at a time: first call → every host answers (dstack's gateway: ${dstack.s} s)`,
      value: ours.totalMs / 1000,
      unit: 's',
      target: `≤ ${targetS} s`,
      ok: ours.totalMs <= targetS * 1000,
      baseline: { name: baselineName, value: unpaced.totalMs / 1000, measured: 'same run' },
      better: 'lower',
      // The machine may be shared: a load that moved between the two rounds moves their ratio too.
      note: `calls took ${(ours.callsMs / 1000).toFixed(1)} s (as dstack: ${(unpaced.callsMs / 1000).toFixed(1)} s); replicas/register p50 ${percentile(ours.replicaMs, 50).toFixed(0)} ms (as dstack: ${percentile(unpaced.replicaMs, 50).toFixed(0)} ms); load avg (1 min, 2 cores) ${loadNote(ours)} (as dstack: ${loadNote(unpaced)})`,
    },
    {
      id: `${id}r`,
      name: `Nginx reloads for those ${(2 * n).toLocaleString('en-US')} calls (dstack's gateway: ${dstack.reloads.toLocaleString('en-US')})`,
      value: ours.reloads,
      unit: 'reloads',
      // The first change is applied at once, then at most one reload a second.
      target: `≤ 1 per second of calls, + the first (${Math.ceil(ours.callsMs / 1000) + 1})`,
      ok: ours.reloads <= Math.ceil(ours.callsMs / 1000) + 1,
      baseline: { name: baselineName, value: unpaced.reloads, measured: 'same run' },
      better: 'lower',
      note: `${perSecond(ours).toFixed(2)} reloads per second of calls (as dstack: ${perSecond(unpaced).toFixed(2)})`,
    },
  ];
}

/** DC2u: DC2 with a connection per replica, as replicas on 1,000 different machines would have. */
function unsharedRow(r: Round, asDstack: Round): Row {
  return {
    id: 'DC2u',
    name: `DC2 with an SSH connection per replica (replicas on as many machines: nothing to share), reloads paced`,
    value: r.totalMs / 1000,
    unit: 's',
    target: '≤ 60 s',
    ok: r.totalMs <= 60_000,
    baseline: { name: 'as dstack: a reload per pass, an SSH connection per replica', value: asDstack.totalMs / 1000, measured: 'same run' },
    better: 'lower',
    note: `calls took ${(r.callsMs / 1000).toFixed(1)} s; replicas/register p50 ${percentile(r.replicaMs, 50).toFixed(0)} ms, p99 ${percentile(r.replicaMs, 99).toFixed(0)} ms; ${r.reloads} reloads; load avg ${loadNote(r)}`,
  };
}

/**
 * DC2m: DC2 with services that have an OpenAI model, whose own site adds CORS: served by Host
 * until that site is (the data plane answers preflights, the default server adds the headers),
 * so each services/register answers reachable without waiting for a reload. Against dstack's
 * published figure (its gateway reloads twice per service whatever the service).
 */
function modelRow(r: Round): Row {
  const n = r.services.toLocaleString('en-US');
  return {
    id: 'DC2m',
    name: `${n} services with an OpenAI model × 1 SSH replica through the dstack routes, one call at a time: first call → every host answers`,
    value: r.totalMs / 1000,
    unit: 's',
    target: '≤ 60 s',
    ok: r.totalMs <= 60_000,
    baseline: { name: "dstack's gateway", value: 305, measured: 'published' },
    better: 'lower',
    note: `services/register p50 ${percentile(r.serviceMs, 50).toFixed(1)} ms, p99 ${percentile(r.serviceMs, 99).toFixed(1)} ms (each answers once the host is served); ${r.reloads} reloads; load avg ${loadNote(r)}`,
  };
}

/** DC3: per-call latency during the 1,000-service paced round, against dstack's published figures. */
function latencyRows(r: Round): Row[] {
  const n = r.services.toLocaleString('en-US');
  const row = (id: string, what: string, ms: number[], p: 50 | 99, dstackMs: number): Row => ({
    id,
    name: `${what} p${p}, one call at a time (${n} services)`,
    value: percentile(ms, p),
    unit: 'ms',
    baseline: { name: "dstack's gateway", value: dstackMs, measured: 'published' },
    better: 'lower',
    // Whether a call costs more as the document grows: the first and the last hundred calls.
    note: `p${p} of the first 100 calls ${percentile(ms.slice(0, 100), p).toFixed(0)} ms, of the last 100 ${percentile(ms.slice(-100), p).toFixed(0)} ms`,
  });
  return [
    {
      ...row('DC3s', 'services/register', r.serviceMs, 50, DSTACK.serviceRegisterMs.p50),
      target: '≤ 37 ms',
      ok: percentile(r.serviceMs, 50) <= 37,
    },
    row('DC3s99', 'services/register', r.serviceMs, 99, DSTACK.serviceRegisterMs.p99),
    row('DC3r', 'replicas/register (answers once the replica is Ready)', r.replicaMs, 50, DSTACK.replicaRegisterMs.p50),
    row('DC3r99', 'replicas/register (answers once the replica is Ready)', r.replicaMs, 99, DSTACK.replicaRegisterMs.p99),
  ];
}

/**
 * How much dearer a services/register is in a large document than in a small one: p99 of the
 * last 100 calls (900–1,000 services) over p99 of calls 11–110 (10–110 services; the first ten
 * warm the JIT). The as-dstack round, same run, is the baseline.
 */
function growth(ms: number[]): number {
  return percentile(ms.slice(-100), 99) / percentile(ms.slice(10, 110), 99);
}

function growthRow(ours: Round, asDstack: Round): Row {
  const value = growth(ours.serviceMs);
  return {
    id: 'DC3sgs',
    name: `services/register p99 of the sync's last 100 calls ÷ p99 of calls 11–110 (${ours.services.toLocaleString('en-US')} services, replicas still connecting; a p99 of 100 calls is their second slowest)`,
    value,
    unit: '×',
    baseline: {
      name: 'as dstack: a reload per pass, an SSH connection per replica',
      value: growth(asDstack.serviceMs),
      measured: 'same run',
    },
    better: 'lower',
    note: `p99 ${percentile(ours.serviceMs.slice(10, 110), 99).toFixed(1)} ms at 10–110 services, ${percentile(ours.serviceMs.slice(-100), 99).toFixed(1)} ms at the last 100`,
  };
}

export async function compatRows(): Promise<Row[]> {
  const small = ['DC1', 'DC1r'].some((id) => wanted(id));
  const large = ['DC2', 'DC2r', 'DC2u', 'DC3s', 'DC3s99', 'DC3sgs', 'DC3r', 'DC3r99'].some((id) => wanted(id));
  const steady = wanted('DC3sg');
  if (!small && !large && !steady && !wanted('DC2m')) return [];
  const f = await startFixture();
  const rows: Row[] = [];
  try {
    // The unpaced baseline first, then ours: whatever the first round warms (sshd, page cache)
    // favours the baseline, not us.
    if (small) {
      const unpaced = await registerRound(f, 100, 'as-dstack');
      const ours = await registerRound(f, 100, 'ours');
      rows.push(...sizeRows('DC1', ours, unpaced, 10));
    }
    if (large) {
      const unpaced = await registerRound(f, 1000, 'as-dstack');
      const unshared = await registerRound(f, 1000, 'unshared');
      const ours = await registerRound(f, 1000, 'ours');
      rows.push(...sizeRows('DC2', ours, unpaced, 60), unsharedRow(unshared, unpaced), ...latencyRows(ours), growthRow(ours, unpaced));
    }
    if (wanted('DC2m')) rows.push(modelRow(await registerRound(f, 1000, 'ours', 'model')));
    if (steady) {
      const asDstack = await steadyRound(f, [10, 1000], 'as-dstack');
      const ours = await steadyRound(f, [10, 1000], 'ours');
      rows.push(steadyGrowthRow(ours, asDstack));
    }
  } finally {
    await f.stop();
  }
  return rows;
}

if (process.argv[1] === fileURLToPath(import.meta.url) && process.argv[2] === 'steady') {
  const f = await startFixture();
  try {
    const mode: Mode = process.argv[3] === 'as-dstack' ? 'as-dstack' : 'ours';
    const s = await steadyRound(f, [10, 1000], mode);
    const slowest = (xs: number[]) =>
      [...xs]
        .sort((a, b) => b - a)
        .slice(0, 5)
        .map((x) => +x.toFixed(1));
    const at = (n: number) => ({
      p50: +percentile(s.bySize.get(n)!, 50).toFixed(1),
      p99: +percentile(s.bySize.get(n)!, 99).toFixed(1),
      slowest: slowest(s.bySize.get(n)!),
    });
    process.stdout.write(
      `${JSON.stringify({ mode, at10: at(10), at1000: at(1000), p99GrowthX: +steadyGrowth(s, 10, 1000).toFixed(2) })}\n`,
    );
  } finally {
    await f.stop();
  }
} else if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const services = Number(process.argv[2] ?? 100);
  const f = await startFixture();
  try {
    const mode: Mode = process.argv[3] === 'as-dstack' || process.argv[3] === 'unshared' ? process.argv[3] : 'ours';
    const kind: Kind = process.argv[4] === 'model' ? 'model' : 'plain';
    const r = await registerRound(f, services, mode, kind, process.argv.includes('probe'));
    const p = (xs: number[]) => ({ p50: +percentile(xs, 50).toFixed(1), p99: +percentile(xs, 99).toFixed(1) });
    process.stdout.write(
      `${JSON.stringify({
        services,
        mode,
        kind,
        ...(r.unservedAfterAnswer !== undefined ? { unservedAfterAnswer: r.unservedAfterAnswer } : {}),
        callsS: +(r.callsMs / 1000).toFixed(2),
        totalS: +(r.totalMs / 1000).toFixed(2),
        reloads: r.reloads,
        reloadsPerSecondOfCalls: +perSecond(r).toFixed(2),
        serviceRegisterMs: p(r.serviceMs),
        serviceRegisterP99GrowthX: +growth(r.serviceMs).toFixed(2),
        // The five slowest of the last 100 and of calls 11–110: a p99 of 100 calls is their second slowest.
        serviceRegisterSlowestMs: [r.serviceMs.slice(-100), r.serviceMs.slice(10, 110)].map((xs) =>
          [...xs]
            .sort((a, b) => b - a)
            .slice(0, 5)
            .map((x) => +x.toFixed(1)),
        ),
        replicaRegisterMs: p(r.replicaMs),
        load: r.load,
      })}\n`,
    );
  } finally {
    await f.stop();
  }
}
