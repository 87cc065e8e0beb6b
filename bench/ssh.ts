// P5: requests/s and p50/p99 through Nginx → balancer socket → ssh2 tunnel vs Nginx → Unix
// socket → OpenSSH `ssh -L` tunnel, same sshd and backend, measured in the same run with wrk
// (-t1 -c16 -d5s): with upstream keepalive, without it (a new channel per request), and a
// 100 MiB download. The backend is a separate Node process, so the tunnel process does
// nothing but tunnel.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { pino } from 'pino';
import { Controller } from '../src/reconcilers/controller.js';
import { createSshLoop } from '../src/reconcilers/ssh/index.js';
import type { AnyLoop } from '../src/reconcilers/types.js';
import { emptyState, type ProxyState } from '../src/spec/types.js';
import { eventually, startTestNginx } from '../test/helpers/nginx.js';
import { freePorts } from '../test/helpers/ports.js';
import { startSshdChain } from '../test/helpers/sshd.js';
import { tmpDir } from '../test/helpers/tmp.js';
import type { Row } from './table.js';

const run = promisify(execFile);
const BIG = 100 * 1024 * 1024; // 100 MiB

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
}

async function wrk(url: string): Promise<Wrk> {
  const { stdout } = await run('wrk', ['-t1', '-c16', '-d5s', '--latency', url], { timeout: 60_000 });
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? 0);
  const ms = (p: string): number => {
    const m = new RegExp(`\\s${p}%\\s+([\\d.]+)(us|ms|s)`).exec(stdout);
    if (!m) return 0;
    const v = Number(m[1]);
    return m[2] === 'us' ? v / 1000 : m[2] === 's' ? v * 1000 : v;
  };
  return { rps, p50: ms('50'), p99: ms('99') };
}

async function download(url: string): Promise<number> {
  const { stdout } = await run('curl', ['-s', '-o', '/dev/null', '-w', '%{speed_download}', url], { timeout: 120_000 });
  return Number(stdout) / (1024 * 1024); // MiB/s
}

export async function sshRows(): Promise<Row[]> {
  const tmp = tmpDir('dp-bench-ssh-');
  const procs: ChildProcess[] = [];
  const chain = await startSshdChain(join(tmp.dir, 'ssh'), 1);
  const sshd = chain.sshds[0]!;
  const ng = await startTestNginx();
  let controller: Controller | undefined;
  let loop: ReturnType<typeof createSshLoop> | undefined;
  try {
    const [appPort, nginxKa, nginxNoKa, opensshKa, opensshNoKa] = (await freePorts(5)) as [number, number, number, number, number];
    const backend = spawn(process.execPath, ['-e', BACKEND, String(appPort)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    procs.push(backend);
    await new Promise((r) => backend.once('message', r));

    // ssh2: the SSH loop with one replica.
    const state: ProxyState = emptyState();
    state.spec.projects = [{ name: 'bench', sshPrivateKey: chain.key.privateKey }];
    state.spec.services = [{ project: 'bench', run: 'app', https: false, auth: false, clientMaxBodySize: 1024, stripPrefix: true, rateLimits: [], replicas: [{ id: 'r1', appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }] }];
    loop = createSshLoop({ stateDir: tmp.dir, appHost: '127.0.0.1' });
    controller = new Controller({ loops: [loop as unknown as AnyLoop], getSpec: () => ({ state, generation: 1 }), logger: pino({ level: 'silent' }) });
    await controller.start();
    await eventually(() => (controller!.statuses().loops.ssh?.objects['bench/app/r1']?.[0]?.reason === 'Connected' ? true : undefined), 20_000);
    const ssh2Sock = loop.balancer.socketPathFor('bench/app');

    // OpenSSH: ssh -L <unix socket>:127.0.0.1:<app>.
    const keyFile = join(tmp.dir, 'ssh', 'client_ed25519');
    const opensshSock = join(tmp.dir, 'openssh.sock');
    const ssh = spawn('ssh', ['-N', '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'LogLevel=ERROR', '-i', keyFile, '-p', String(sshd.port), '-L', `${opensshSock}:127.0.0.1:${appPort}`, `${sshd.user}@127.0.0.1`], { stdio: 'ignore' });
    procs.push(ssh);
    await eventually(() => (existsSync(opensshSock) ? true : undefined), 20_000);

    const site = (port: number, sock: string, keepalive: boolean): string => `
upstream u${port} { server unix:${sock};${keepalive ? ' keepalive 64; keepalive_time 10s;' : ''} }
server {
  listen 127.0.0.1:${port};
  location / { proxy_pass http://u${port}; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
}`;
    writeFileSync(join(ng.paths.confDir, 'sites', 'bench-ssh.conf'), [site(nginxKa, ssh2Sock, true), site(nginxNoKa, ssh2Sock, false), site(opensshKa, opensshSock, true), site(opensshNoKa, opensshSock, false)].join('\n'));
    await ng.reload();
    await eventually(async () => ((await wrkWarm(`http://127.0.0.1:${nginxKa}/`)) ? true : undefined));

    const rows: Row[] = [];
    const pair = async (id: string, name: string, ours: number, theirs: number): Promise<void> => {
      // Alternating rounds, median of 3: the machine is shared, load drifts between runs.
      const as: Wrk[] = [];
      const bs: Wrk[] = [];
      for (let i = 0; i < 3; i++) {
        as.push(await wrk(`http://127.0.0.1:${ours}/`));
        bs.push(await wrk(`http://127.0.0.1:${theirs}/`));
      }
      const a = median(as);
      const b = median(bs);
      rows.push({
        id,
        name,
        value: Math.round(a.rps),
        unit: 'req/s',
        target: '≥ 1.0× OpenSSH',
        ok: a.rps >= b.rps,
        better: 'higher',
        baseline: { name: 'nginx → ssh -L (OpenSSH)', value: Math.round(b.rps), measured: 'same run' },
        note: `p50/p99 ssh2 ${a.p50}/${a.p99} ms, OpenSSH ${b.p50}/${b.p99} ms`,
      });
    };
    await pair('P5', 'nginx → balancer → ssh2, upstream keepalive, 16 conns', nginxKa, opensshKa);
    await pair('P5b', 'nginx → balancer → ssh2, a new channel per request', nginxNoKa, opensshNoKa);
    const ours = await download(`http://127.0.0.1:${nginxKa}/big`);
    const theirs = await download(`http://127.0.0.1:${opensshKa}/big`);
    rows.push({ id: 'P5c', name: '100 MiB download through nginx → balancer → ssh2', value: Math.round(ours), unit: 'MiB/s', target: '≥ 1.0× OpenSSH', ok: ours >= theirs, better: 'higher', baseline: { name: 'nginx → ssh -L (OpenSSH)', value: Math.round(theirs), measured: 'same run' } });
    return rows;
  } finally {
    await controller?.stop();
    await loop?.close();
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
