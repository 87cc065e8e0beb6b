// P6: the in-server proxy (its raw fast path, src/http1 over the data plane's replicas) vs Nginx proxy_pass
// to the same replica, wrk -t1 -c16 -d5s, alternating rounds, median of 5, measured in one run:
// a direct replica (Nginx → TCP with upstream keepalive) and an SSH replica (Nginx → the same
// SSH loop's balancer socket → ssh2). P6c: the proxy's RSS during a 1 GiB chunked upload.
// The backend is a separate Node process; the proxy runs in this process.
// DSTACK_PROXY_BENCH_BEFORE=<dist of another build>: that build's in-server proxy runs here too,
// with the same document, and P6/P6b measure it in the same rounds as "before".

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { pino } from 'pino';
import { startServerProxy, type RunningServerProxy } from '../src/daemon/server-proxy.js';
import { eventually, startTestNginx } from '../test/helpers/nginx.js';
import { freePorts } from '../test/helpers/ports.js';
import { startSshdChain } from '../test/helpers/sshd.js';
import { tmpDir } from '../test/helpers/tmp.js';
import type { ProxyState } from '../src/spec/types.js';
import { wanted, type Row } from './table.js';
import { runWrk, type WrkResult } from './wrk.js';

const run = promisify(execFile);
const GiB = 1024 * 1024 * 1024;
/** Alternating rounds per pair; the median is reported (wrk, the replica and the proxy share two cores: single runs vary by ±20 %). */
const ROUNDS = 5;

const BACKEND = `
const http = require('node:http');
http.createServer((req, res) => {
  if (req.url.endsWith('/sink')) {
    let n = 0;
    req.on('data', (c) => { n += c.length; });
    req.on('end', () => res.end(JSON.stringify({ bytes: n })));
    return;
  }
  res.setHeader('content-type', 'application/json');
  res.end('{"ok":true}');
}).listen(Number(process.argv[1]), '127.0.0.1', () => process.send && process.send('up'));
`;

/** cpuUs: this process's CPU per request during the run, µs; the proxies live here, so it is the measured proxy's own cost (steadier than req/s on a loaded machine). */
type Wrk = Pick<WrkResult, 'rps' | 'p50' | 'p99'> & { cpuUs: number };

const wrk = async (url: string): Promise<Wrk> => {
  const cpu0 = process.cpuUsage();
  const r = await runWrk(url);
  const cpu = process.cpuUsage(cpu0);
  return { rps: r.rps, p50: r.p50, p99: r.p99, cpuUs: r.requests > 0 ? (cpu.user + cpu.system) / r.requests : 0 };
};

/** Each figure's median over the rounds, taken separately (one round's GC pause or preemption does not decide the p99). */
function median(runs: Wrk[]): Wrk {
  const mid = (k: keyof Wrk): number => [...runs].map((r) => r[k]).sort((x, y) => x - y)[Math.floor(runs.length / 2)]!;
  return { rps: mid('rps'), p50: mid('p50'), p99: mid('p99'), cpuUs: mid('cpuUs') };
}

async function ok(url: string): Promise<true | undefined> {
  const { stdout } = await run('curl', ['-s', url]).catch(() => ({ stdout: '' }));
  return stdout.includes('"ok"') ? true : undefined;
}

export async function serverProxyRows(): Promise<Row[]> {
  const tmp = tmpDir('dp-bench-sp-');
  const procs: ChildProcess[] = [];
  const chain = await startSshdChain(join(tmp.dir, 'ssh'), 1);
  const sshd = chain.sshds[0]!;
  const ng = await startTestNginx();
  let proxy: RunningServerProxy | undefined;
  let previous: RunningServerProxy | undefined;
  try {
    const [appPort, nginxDirect, nginxSsh] = (await freePorts(3)) as [number, number, number];
    const backend = spawn(process.execPath, ['-e', BACKEND, String(appPort)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    procs.push(backend);
    await new Promise((r) => backend.once('message', r));

    proxy = await startServerProxy(
      { db: `sqlite:${join(tmp.dir, 'proxy.db')}`, port: 0, stateDir: join(tmp.dir, 'state') },
      { logger: pino({ level: 'silent' }), ssh: { appHost: '127.0.0.1' } },
    );
    const common = { auth: false, clientMaxBodySize: 2 * GiB };
    const doc: ProxyState = {
      apiVersion: 'proxy.dstack.ai/v1alpha1',
      kind: 'ProxyState',
      spec: {
        acme: { server: 'https://acme-v02.api.letsencrypt.org/directory' },
        entrypoints: [],
        projects: [{ name: 'bench', sshPrivateKey: chain.key.privateKey }],
        services: [
          {
            project: 'bench',
            run: 'direct',
            https: false,
            stripPrefix: true,
            rateLimits: [],
            ...common,
            replicas: [{ id: 'd1', appPort, direct: { host: '127.0.0.1', port: appPort } }],
          },
          {
            project: 'bench',
            run: 'ssh',
            https: false,
            stripPrefix: true,
            rateLimits: [],
            ...common,
            replicas: [{ id: 's1', appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
          },
        ],
      },
    };
    await proxy.store.write(doc);
    const ours = (run: string): string => `${proxy!.url}/proxy/services/bench/${run}/`;
    await eventually(() => ok(ours('direct')), 20_000);
    await eventually(() => ok(ours('ssh')), 20_000);
    const beforeDist = process.env.DSTACK_PROXY_BENCH_BEFORE;
    if (beforeDist) {
      const m = (await import(join(resolve(beforeDist), 'src/daemon/server-proxy.js'))) as { startServerProxy: typeof startServerProxy };
      previous = await m.startServerProxy(
        { db: `sqlite:${join(tmp.dir, 'before.db')}`, port: 0, stateDir: join(tmp.dir, 'state-before') },
        { logger: pino({ level: 'silent' }), ssh: { appHost: '127.0.0.1' } },
      );
      await previous.store.write(doc);
    }
    const older = (run: string): string | undefined => previous && `${previous.url}/proxy/services/bench/${run}/`;
    if (previous) {
      await eventually(() => ok(older('direct')!), 20_000);
      await eventually(() => ok(older('ssh')!), 20_000);
    }

    const sshSock = proxy.ssh.balancer.socketPathFor('bench/ssh');
    writeFileSync(
      join(ng.paths.confDir, 'sites', 'bench-sp.conf'),
      `
upstream sp_direct { server 127.0.0.1:${appPort}; keepalive 64; }
upstream sp_ssh { server unix:${sshSock}; keepalive 64; keepalive_time 10s; }
server { listen 127.0.0.1:${nginxDirect}; location / { proxy_pass http://sp_direct; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
server { listen 127.0.0.1:${nginxSsh}; location / { proxy_pass http://sp_ssh; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
`,
    );
    await ng.reload();
    await eventually(() => ok(`http://127.0.0.1:${nginxDirect}/`));
    await eventually(() => ok(`http://127.0.0.1:${nginxSsh}/`));

    const rows: Row[] = [];
    const pair = async (id: string, what: string, oursUrl: string, nginxUrl: string, beforeUrl?: string): Promise<void> => {
      if (!wanted(id)) return;
      const as: Wrk[] = [];
      const bs: Wrk[] = [];
      const cs: Wrk[] = [];
      await wrk(oursUrl); // warm-up: JIT and pooled connections, not measured
      await wrk(nginxUrl);
      if (beforeUrl) await wrk(beforeUrl);
      for (let i = 0; i < ROUNDS; i++) {
        if (!beforeUrl) {
          as.push(await wrk(oursUrl));
          bs.push(await wrk(nginxUrl));
          continue;
        }
        // Three sides: the order rotates each round, so a drift in the machine's load does not
        // always fall on the same one.
        const sides = [
          [oursUrl, as],
          [nginxUrl, bs],
          [beforeUrl, cs],
        ] as const;
        for (let k = 0; k < sides.length; k++) {
          const [url, into] = sides[(i + k) % sides.length]!;
          into.push(await wrk(url));
        }
      }
      const a = median(as);
      const b = median(bs);
      const c = beforeUrl ? median(cs) : undefined;
      const versus = c
        ? `; before (${beforeDist}) ${Math.round(c.rps)} req/s vs after ${Math.round(a.rps)} req/s, p50/p99 ${c.p50}/${c.p99} ms, after/before ${(a.rps / c.rps).toFixed(2)}× (per round ${as.map((r, i) => (r.rps / cs[i]!.rps).toFixed(2)).join(' ')}), p99 per round ${cs.map((r) => r.p99).join(' ')}; proxy CPU per request after ${Math.round(a.cpuUs)} µs, before ${Math.round(c.cpuUs)} µs`
        : '';
      const added = Math.max(0, a.p99 - b.p99);
      rows.push({
        id,
        name: `in-server proxy, ${what}, 16 conns`,
        value: Math.round(a.rps),
        unit: 'req/s',
        target: '≥ 0.6× Nginx, ≤ 2 ms added p99',
        ok: a.rps >= 0.6 * b.rps && added <= 2,
        better: 'higher',
        baseline: { name: 'Nginx proxy_pass', value: Math.round(b.rps), measured: 'same run' },
        note: `p50/p99 ours ${a.p50}/${a.p99} ms, Nginx ${b.p50}/${b.p99} ms (added p99 ${added.toFixed(2)} ms); medians of ${ROUNDS} alternating rounds, p99 per round ours ${as.map((r) => r.p99).join(' ')}, Nginx ${bs.map((r) => r.p99).join(' ')}${versus}`,
      });
    };
    await pair('P6', 'direct replica', ours('direct'), `http://127.0.0.1:${nginxDirect}/`, older('direct'));
    await pair('P6b', 'SSH replica (ssh2)', ours('ssh'), `http://127.0.0.1:${nginxSsh}/`, older('ssh'));
    if (!wanted('P6c')) return rows;

    // P6c: RSS of this process (the proxy) while curl uploads 1 GiB, chunked, through it. A first
    // upload into a fresh heap also measures V8 sizing its heap (it frees upload buffers only when
    // their external memory has grown by tens of MB): 256 MiB go through first, reported apart.
    const upload = async (bytes: number): Promise<{ grewMb: number; seconds: number; before: number; peak: number }> => {
      const before = process.memoryUsage().rss;
      let peak = before;
      const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
      const started = Date.now();
      try {
        const { stdout } = await run('sh', ['-c', `head -c ${bytes} /dev/zero | curl -s -T - -X POST ${ours('direct')}sink`], {
          timeout: 300_000,
        });
        if (!stdout.includes(`"bytes":${bytes}`)) throw new Error(`upload through the proxy failed: ${stdout}`);
      } finally {
        clearInterval(timer);
      }
      return { grewMb: (peak - before) / 1e6, seconds: (Date.now() - started) / 1000, before, peak };
    };
    const first = await upload(GiB / 4);
    const { grewMb, seconds, before, peak } = await upload(GiB);
    rows.push({
      id: 'P6c',
      name: 'in-server proxy RSS growth during a 1 GiB streamed upload (after a 256 MiB one)',
      value: Math.round(grewMb * 10) / 10,
      unit: 'MB',
      target: '< 50 MB',
      ok: grewMb < 50,
      better: 'lower',
      note: `RSS ${Math.round(before / 1e6)} → peak ${Math.round(peak / 1e6)} MB; ${(GiB / 1024 / 1024 / seconds).toFixed(0)} MiB/s; the 256 MiB warm-up upload grew it ${first.grewMb.toFixed(1)} MB`,
    });
    return rows;
  } finally {
    await proxy?.close();
    await previous?.close();
    for (const p of procs) p.kill('SIGKILL');
    await ng.stop();
    await chain.stop();
    tmp.cleanup();
  }
}

// Run alone: node dist/bench/server-proxy.js
if (process.argv[1]?.endsWith('/bench/server-proxy.js')) {
  serverProxyRows().then(
    (rows) => process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`),
    (err: unknown) => {
      process.stderr.write(`${String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
