// P5: requests/s and p50/p99 through Nginx → balancer socket (the per-request balancer: it reads
// each request head and picks a replica for it) → ssh2 tunnel vs Nginx → Unix socket → OpenSSH
// `ssh -L` tunnel, same sshd and backend, measured in the same run with wrk (-t1 -c16 -d5s): with
// Nginx's upstream keepalive, without it (a new connection to the socket per request), and a
// 100 MiB download. The ssh2 side is the SSH loop alone in a child process
// (bench/ssh-child.ts), the backend another, so each tunnel process does nothing but tunnel
// and its CPU per request can be read from /proc next to the ssh client's.
// DSTACK_PROXY_BENCH_BEFORE=<dist of another build>: that build's tunnel child runs too, behind
// sites of its own, and P5/P5b/P5c measure it in the same rounds as "before".
// P8 (bench/ssh-scale.ts): RSS and idle CPU with 500 live tunnels.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { socketPathFor } from '../src/dataplane/index.js';
import { emptyState, type ProxyState } from '../src/spec/types.js';
import { eventually, startTestNginx } from '../test/helpers/nginx.js';
import { freePorts } from '../test/helpers/ports.js';
import { startSshdChain } from '../test/helpers/sshd.js';
import { tmpDir } from '../test/helpers/tmp.js';
import { scaleRows, startChild, stopChild } from './ssh-scale.js';
import { wanted, type Row } from './table.js';
import { runWrk } from './wrk.js';

const run = promisify(execFile);
const BIG = 100 * 1024 * 1024; // 100 MiB
/** wrk rounds per pair, alternating which side goes first; the median is reported. */
const ROUNDS = 5;
const DOWNLOAD_ROUNDS = 3;

const BACKEND = `
const http = require('node:http');
const big = Buffer.alloc(1024 * 1024, 120);
http.createServer((req, res) => {
  if (req.url === '/big') {
    res.setHeader('content-length', String(${BIG}));
    let n = 0;
    const pump = () => { while (n < ${BIG / (1024 * 1024)}) { n++; if (!res.write(big)) return res.once('drain', pump); } res.end(); };
    return pump();
  }
  res.setHeader('content-type', 'application/json');
  res.end('{"ok":true}');
}).listen(Number(process.argv[1]), '127.0.0.1', () => process.send && process.send('up'));
`;

interface Wrk {
  rps: number;
  p50: number;
  p99: number;
  /** CPU time of the tunnel process per request, µs. */
  cpuUs: number;
}

/** User + system CPU of a process so far, µs (clock ticks of 10 ms). */
function cpuOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10_000;
}

async function wrk(url: string, tunnelPid: number, seconds = 5): Promise<Wrk> {
  const cpu0 = cpuOf(tunnelPid);
  const r = await runWrk(url, seconds);
  const cpuUs = cpuOf(tunnelPid) - cpu0;
  return { rps: r.rps, p50: r.p50, p99: r.p99, cpuUs: r.requests > 0 ? cpuUs / r.requests : 0 };
}

async function download(url: string): Promise<number> {
  const { stdout } = await run('curl', ['-s', '-o', '/dev/null', '-w', '%{speed_download}', url], { timeout: 120_000 });
  return Number(stdout) / (1024 * 1024); // MiB/s
}

export async function sshRows(): Promise<Row[]> {
  return [
    ...(['P5', 'P5b', 'P5c'].some((id) => wanted(id)) ? await p5Rows() : []),
    ...(wanted('P8') || wanted('P8b') ? await scaleRows() : []),
  ];
}

async function p5Rows(): Promise<Row[]> {
  const tmp = tmpDir('dp-bench-ssh-');
  const procs: ChildProcess[] = [];
  const chain = await startSshdChain(join(tmp.dir, 'ssh'), 1);
  const sshd = chain.sshds[0]!;
  const ng = await startTestNginx();
  let tunnels: ChildProcess | undefined;
  let previous: ChildProcess | undefined;
  const beforeDist = process.env.DSTACK_PROXY_BENCH_BEFORE;
  try {
    const [appPort, nginxKa, nginxNoKa, opensshKa, opensshNoKa, beforeKa, beforeNoKa] = (await freePorts(7)) as [
      number,
      number,
      number,
      number,
      number,
      number,
      number,
    ];
    const backend = spawn(process.execPath, ['-e', BACKEND, String(appPort)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    procs.push(backend);
    await new Promise((r) => backend.once('message', r));

    // ssh2: the SSH loop with one replica, in its own process.
    const state: ProxyState = emptyState();
    state.spec.projects = [{ name: 'bench', sshPrivateKey: chain.key.privateKey }];
    state.spec.services = [
      {
        project: 'bench',
        run: 'app',
        https: false,
        auth: false,
        clientMaxBodySize: 1024,
        stripPrefix: true,
        rateLimits: [],
        replicas: [{ id: 'r1', appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
      },
    ];
    const stateDir = join(tmp.dir, 'gw');
    tunnels = await startChild(state, stateDir, 30_000);
    const ssh2Sock = socketPathFor(join(stateDir, 'sockets'), 'bench/app');
    if (beforeDist) previous = await startChild(state, join(tmp.dir, 'gw-before'), 30_000, join(resolve(beforeDist), 'bench/ssh-child.js'));
    const beforeSock = socketPathFor(join(tmp.dir, 'gw-before', 'sockets'), 'bench/app');

    // OpenSSH: ssh -L <unix socket>:127.0.0.1:<app>, its default cipher (chacha20-poly1305).
    const keyFile = join(tmp.dir, 'ssh', 'client_ed25519');
    const opensshSock = join(tmp.dir, 'openssh.sock');
    const ssh = spawn(
      'ssh',
      [
        '-N',
        '-o',
        'StrictHostKeyChecking=no',
        '-o',
        'UserKnownHostsFile=/dev/null',
        '-o',
        'LogLevel=ERROR',
        '-i',
        keyFile,
        '-p',
        String(sshd.port),
        '-L',
        `${opensshSock}:127.0.0.1:${appPort}`,
        `${sshd.user}@127.0.0.1`,
      ],
      { stdio: 'ignore' },
    );
    procs.push(ssh);
    await eventually(() => (existsSync(opensshSock) ? true : undefined), 20_000);

    const site = (port: number, sock: string, keepalive: boolean): string => `
upstream u${port} { server unix:${sock};${keepalive ? ' keepalive 64; keepalive_time 10s;' : ''} }
server {
  listen 127.0.0.1:${port};
  location / { proxy_pass http://u${port}; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
}`;
    writeFileSync(
      join(ng.paths.confDir, 'sites', 'bench-ssh.conf'),
      [
        site(nginxKa, ssh2Sock, true),
        site(nginxNoKa, ssh2Sock, false),
        site(opensshKa, opensshSock, true),
        site(opensshNoKa, opensshSock, false),
        ...(previous ? [site(beforeKa, beforeSock, true), site(beforeNoKa, beforeSock, false)] : []),
      ].join('\n'),
    );
    await ng.reload();
    await eventually(async () => ((await wrkWarm(`http://127.0.0.1:${nginxKa}/`)) ? true : undefined));
    await eventually(async () => ((await wrkWarm(`http://127.0.0.1:${opensshKa}/`)) ? true : undefined));
    const ours = { pid: tunnels.pid ?? 0, ka: nginxKa, noKa: nginxNoKa };
    const theirs = { pid: ssh.pid ?? 0, ka: opensshKa, noKa: opensshNoKa };
    const older = previous ? { pid: previous.pid ?? 0, ka: beforeKa, noKa: beforeNoKa } : undefined;
    if (older) await eventually(async () => ((await wrkWarm(`http://127.0.0.1:${beforeKa}/`)) ? true : undefined));
    const sides = older ? [ours, theirs, older] : [ours, theirs];
    /** Round i's order: alternating, or rotating when there are three sides (load drifts between runs). */
    const orderOf = (i: number): typeof sides =>
      older ? sides.map((_, k) => sides[(i + k) % sides.length]!) : i % 2 === 0 ? [ours, theirs] : [theirs, ours];
    // Warm-up: the first seconds of the ssh2 process are spent in V8's optimising compiler.
    for (const side of sides) for (const port of [side.ka, side.noKa]) await wrk(`http://127.0.0.1:${port}/`, side.pid, 2);

    const rows: Row[] = [];
    const pair = async (id: string, name: string, mode: 'ka' | 'noKa'): Promise<void> => {
      if (!wanted(id)) return;
      // Alternating rounds, medians: the machine is shared, load drifts between runs.
      const as: Wrk[] = [];
      const bs: Wrk[] = [];
      const cs: Wrk[] = [];
      for (let i = 0; i < ROUNDS; i++) {
        for (const side of orderOf(i))
          (side === ours ? as : side === theirs ? bs : cs).push(await wrk(`http://127.0.0.1:${side[mode]}/`, side.pid));
      }
      const a = median(as);
      const b = median(bs);
      const cpu = (xs: Wrk[]): number => Math.round(medianOf(xs.map((x) => x.cpuUs)));
      const c = older ? median(cs) : undefined;
      const versus = c
        ? `; before (${beforeDist}) ${Math.round(c.rps)} req/s vs after ${Math.round(a.rps)} req/s (${(a.rps / c.rps).toFixed(2)}×), p50/p99 ${c.p50}/${c.p99} ms, tunnel CPU per request ${cpu(cs)} µs`
        : '';
      rows.push({
        id,
        name,
        value: Math.round(a.rps),
        unit: 'req/s',
        target: '≥ 1.0× OpenSSH',
        ok: a.rps >= b.rps,
        better: 'higher',
        baseline: { name: 'nginx → ssh -L (OpenSSH)', value: Math.round(b.rps), measured: 'same run' },
        note: `p50/p99 ssh2 ${a.p50}/${a.p99} ms, OpenSSH ${b.p50}/${b.p99} ms; tunnel CPU per request ssh2 ${cpu(as)} µs, OpenSSH ${cpu(bs)} µs; medians of ${ROUNDS} alternating rounds${versus}`,
      });
    };
    await pair('P5', 'nginx → per-request balancer → ssh2, upstream keepalive, 16 conns', 'ka');
    await pair('P5b', 'nginx → per-request balancer → ssh2, a new Nginx → socket connection per request', 'noKa');
    if (!wanted('P5c')) return rows;
    const down: { ours: number[]; theirs: number[]; older: number[] } = { ours: [], theirs: [], older: [] };
    for (let i = 0; i < DOWNLOAD_ROUNDS; i++) {
      for (const side of orderOf(i)) {
        down[side === ours ? 'ours' : side === theirs ? 'theirs' : 'older'].push(await download(`http://127.0.0.1:${side.ka}/big`));
      }
    }
    const d = { ours: medianOf(down.ours), theirs: medianOf(down.theirs), older: medianOf(down.older) };
    rows.push({
      id: 'P5c',
      name: '100 MiB download through nginx → per-request balancer → ssh2',
      value: Math.round(d.ours),
      unit: 'MiB/s',
      target: '≥ 1.0× OpenSSH',
      ok: d.ours >= d.theirs,
      better: 'higher',
      baseline: { name: 'nginx → ssh -L (OpenSSH)', value: Math.round(d.theirs), measured: 'same run' },
      note: `medians of ${DOWNLOAD_ROUNDS} alternating rounds${older ? `; before (${beforeDist}) ${Math.round(d.older)} MiB/s` : ''}`,
    });
    return rows;
  } finally {
    if (tunnels) await stopChild(tunnels).catch(() => tunnels?.kill('SIGKILL'));
    if (previous) await stopChild(previous).catch(() => previous?.kill('SIGKILL'));
    for (const p of procs) p.kill('SIGKILL');
    await ng.stop();
    await chain.stop();
    tmp.cleanup();
  }
}

function median(runs: Wrk[]): Wrk {
  const sorted = [...runs].sort((x, y) => x.rps - y.rps);
  return sorted[Math.floor(sorted.length / 2)]!;
}

function medianOf(xs: number[]): number {
  const sorted = [...xs].sort((x, y) => x - y);
  return sorted[Math.floor(sorted.length / 2)] ?? 0;
}

async function wrkWarm(url: string): Promise<boolean> {
  const { stdout } = await run('curl', ['-s', url]);
  return stdout.includes('"ok"');
}

// Run alone: node dist/bench/ssh.js
if (process.argv[1]?.endsWith('/bench/ssh.js')) {
  sshRows().then(
    (rows) => process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`),
    (err: unknown) => {
      process.stderr.write(`${String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
