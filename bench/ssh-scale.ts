// P8: memory and idle CPU of the process that holds 500 live replica tunnels. The far end is an
// in-process ssh2 Server (one listener, publickey auth, direct-tcpip to a local TCP app), so no
// sshd has to fork 500 sessions; the tunnels live in a child process (bench/ssh-child.ts) that
// runs the SSH loop with its defaults: keepalive every 15 s, app-port probe every 10 s.

import { fork, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer as createTcpServer, connect as tcpConnect, type Server as TcpServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { timingSafeEqual } from 'node:crypto';
import ssh2 from 'ssh2';
import { emptyState, type ProxyState, type Service } from '../src/spec/types.js';
import { tmpDir } from '../test/helpers/tmp.js';
import type { ChildStart, ChildStats } from './ssh-child.js';
import type { Row } from './table.js';

const { Server, utils } = ssh2;
const MiB = 1024 * 1024;
/** dstack's gateway: 530 MiB of RSS with 100 replicas (published figure). */
const DSTACK_MIB_PER_100 = 530;

export const CHILD_PATH = fileURLToPath(new URL('./ssh-child.js', import.meta.url));

export interface ScaleOptions {
  services?: number;
  replicasPerService?: number;
  /** How long CPU is sampled while idle. Default 30 s (three probe rounds, two keepalives). */
  idleMs?: number;
}

/** Starts the tunnel child (this build's, or the one at `childPath`) with `spec`; resolves once every replica is Ready. */
export async function startChild(
  spec: ProxyState,
  stateDir: string,
  readyTimeoutMs: number,
  childPath = CHILD_PATH,
): Promise<ChildProcess> {
  const child = fork(childPath, [], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`tunnel child not ready within ${readyTimeoutMs} ms`)), readyTimeoutMs);
    child.once('message', () => {
      clearTimeout(timer);
      resolve();
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`tunnel child exited with ${code}`));
    });
  });
  child.send({ spec, stateDir } satisfies ChildStart);
  await ready;
  return child;
}

export function childStats(child: ChildProcess): Promise<ChildStats> {
  return new Promise((resolve) => {
    child.once('message', (m) => resolve(m as ChildStats));
    child.send('stats');
  });
}

export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.send('stop');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Peak RSS (VmHWM) of a process, bytes. */
function peakRss(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

interface FarEnd {
  port: number;
  clients: () => number;
  close: () => Promise<void>;
}

/** An ssh2 Server on 127.0.0.1 that accepts `publicKey` and forwards direct-tcpip to 127.0.0.1. */
async function startFarEnd(publicKey: string): Promise<FarEnd> {
  const allowed = utils.parseKey(publicKey);
  if (allowed instanceof Error) throw allowed;
  const allowedBlob = allowed.getPublicSSH();
  const host = utils.generateKeyPairSync('ed25519');
  let live = 0;
  const server = new Server({ hostKeys: [host.private] }, (client) => {
    live++;
    client.once('close', () => live--);
    client.on('error', () => undefined);
    client.on('authentication', (ctx) => {
      if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
      const blob = ctx.key.data;
      if (blob.length !== allowedBlob.length || !timingSafeEqual(blob, allowedBlob)) return ctx.reject();
      if (ctx.signature && ctx.blob && allowed.verify(ctx.blob, ctx.signature, ctx.hashAlgo) !== true) return ctx.reject();
      ctx.accept();
    });
    client.on('ready', () => {
      client.on('tcpip', (accept, reject, info) => {
        const up = tcpConnect({ host: '127.0.0.1', port: info.destPort });
        up.once('error', () => reject());
        up.once('connect', () => {
          const ch = accept();
          ch.pipe(up).pipe(ch);
          ch.on('error', () => up.destroy());
          ch.once('close', () => up.destroy());
          up.once('close', () => ch.close());
        });
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    port,
    clients: () => live,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

function scaleSpec(privateKey: string, port: number, appPort: number, services: number, perService: number): ProxyState {
  const state = emptyState();
  state.spec.projects = [{ name: 'bench', sshPrivateKey: privateKey }];
  const list: Service[] = [];
  for (let s = 0; s < services; s++) {
    list.push({
      project: 'bench',
      run: `svc-${s}`,
      https: false,
      auth: false,
      clientMaxBodySize: 1024,
      stripPrefix: true,
      rateLimits: [],
      replicas: Array.from({ length: perService }, (_, r) => ({
        id: `r-${s}-${r}`,
        appPort,
        ssh: { host: '127.0.0.1', port, user: 'bench' },
      })),
    });
  }
  state.spec.services = list;
  return state;
}

export async function scaleRows(o: ScaleOptions = {}): Promise<Row[]> {
  const services = o.services ?? 100;
  const perService = o.replicasPerService ?? 5;
  const idleMs = o.idleMs ?? 30_000;
  const total = services * perService;
  const tmp = tmpDir('dp-bench-ssh-scale-');
  const keys = utils.generateKeyPairSync('ed25519');
  const app: TcpServer = createTcpServer((s) => s.end());
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const appAddress = app.address();
  const appPort = typeof appAddress === 'object' && appAddress ? appAddress.port : 0;
  const far = await startFarEnd(keys.public);
  const children: ChildProcess[] = [];
  try {
    // The runtime alone: the same child with no replica.
    const empty = await startChild(emptyState(), `${tmp.dir}/empty`, 30_000);
    children.push(empty);
    await new Promise((r) => setTimeout(r, 2_000));
    const base = await childStats(empty);
    await stopChild(empty);

    const started = Date.now();
    const child = await startChild(scaleSpec(keys.private, far.port, appPort, services, perService), `${tmp.dir}/scale`, 180_000);
    children.push(child);
    const readyMs = Date.now() - started;
    if (far.clients() < total) throw new Error(`expected ${total} live SSH connections, the far end has ${far.clients()}`);
    await new Promise((r) => setTimeout(r, 5_000)); // the connect burst's garbage settles
    const s0 = await childStats(child);
    await new Promise((r) => setTimeout(r, idleMs));
    const s1 = await childStats(child);
    const peak = peakRss(child.pid ?? 0);
    const rssMiB = s1.rss / MiB;
    const cpuPct = ((s1.cpuUs - s0.cpuUs) / (idleMs * 1000)) * 100;
    const perReplicaKiB = (s1.rss - base.rss) / total / 1024;
    return [
      {
        id: 'P8',
        name: `RSS of the tunnel process with ${total} live replica tunnels (${services} services × ${perService})`,
        value: Math.round(rssMiB),
        unit: 'MiB',
        target: '≤ 250 MB',
        ok: s1.rss <= 250e6,
        better: 'lower',
        baseline: { name: 'dstack gateway with 100 replicas', value: DSTACK_MIB_PER_100, measured: 'published' },
        note: `runtime alone ${Math.round(base.rss / MiB)} MiB, +${Math.round(perReplicaKiB)} KiB per tunnel (dstack ${(DSTACK_MIB_PER_100 / 100).toFixed(1)} MiB per replica); peak ${Math.round(peak / MiB)} MiB; all ${total} Ready in ${(readyMs / 1000).toFixed(1)} s`,
      },
      {
        id: 'P8b',
        name: `CPU of the tunnel process while idle, ${total} tunnels (keepalive 15 s, probe 10 s)`,
        value: Number(cpuPct.toFixed(2)),
        unit: '% of a core',
        better: 'lower',
        note: `sampled over ${idleMs / 1000} s`,
      },
    ];
  } finally {
    for (const c of children) await stopChild(c).catch(() => c.kill('SIGKILL'));
    await far.close();
    await new Promise((r) => app.close(r));
    tmp.cleanup();
  }
}
