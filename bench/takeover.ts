// Hand-over rows: a gateway with 100 services over the operator's Nginx (system mode, its own
// daemonised master on free ports of 127.0.0.1), a steady load through Nginx to all of them,
// and the gateway replaced twice while it runs: by `gateway --take-over true` started beside it,
// and, as the baseline, by stopping it and starting a new one (what a restart of the unit does).
// Counted: requests that failed, and the longest time between two answers.

import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { writeMainConf } from '../src/reconcilers/nginx/nginx-process.js';
import { API_VERSION, KIND } from '../src/spec/index.js';
import { freePort } from './gateway.js';
import type { Row } from './table.js';

const SERVICES = 100;
/** Clients in flight through Nginx, each sending its next request when the last is answered. */
const CLIENTS = 4;
/** How long the load runs on after the replaced gateway is gone. */
const AFTER_MS = 1_000;
const CLI = path.resolve('dist/src/cli.js');
const NGINX = '/usr/sbin/nginx';

interface Window {
  failed: number;
  answered: number;
  longestGapMs: number;
  /** From the replacement's start to the old process's exit (take-over) or the new one's readiness (restart). */
  tookMs: number;
  /** The first failures, as status + body. */
  samples: string[];
}

interface Child {
  proc: ChildProcess;
  out: () => string;
  exited: Promise<number | null>;
}

export async function takeOverRows(): Promise<Row[]> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-takeover-'));
  // The Nginx workers (www-data, the gateway's default) enter the worker dir under it.
  chmodSync(dir, 0o711);
  const prefix = path.join(dir, 'nginx');
  const { confPath, errorLogPath } = await writeMainConf(prefix, { user: 'root', workerProcesses: 2 });
  await execa(NGINX, ['-p', prefix, '-c', confPath]);
  const replica = http.createServer((_req, res) => res.end('ok'));
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  const replicaPort = (replica.address() as { port: number }).port;
  const [apiPort, httpPort, httpsPort] = [await freePort(), await freePort(), await freePort()];
  const args = [
    ...['gateway', '--state-dir', path.join(dir, 'state'), '--api-port', String(apiPort), '--http-port', String(httpPort)],
    ...['--https-port', String(httpsPort), '--listen-host', '127.0.0.1', '--log-level', 'warn', '--resync-interval', '3600'],
    ...['--nginx', 'system', '--sites-dir', path.join(prefix, 'conf.d'), '--nginx-conf', confPath],
    ...['--reload-command', `${NGINX} -s reload -p ${prefix} -c ${confPath}`, '--test-command', `${NGINX} -t -q -p ${prefix}`],
    ...['--drain-period', '10'],
  ];
  const children: Child[] = [];
  const start = (extra: string[] = []): Child => {
    const proc = spawn(process.execPath, [CLI, ...args, ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
    let out = '';
    proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const c = {
      proc,
      out: () => out,
      exited: new Promise<number | null>((r) => proc.once('exit', (code, signal) => r(code ?? (signal ? -1 : null)))),
      signal: () => proc.signalCode,
    };
    children.push(c);
    return c;
  };
  const hosts = Array.from({ length: SERVICES }, (_, i) => `svc${i}.gw.test`);
  try {
    let current = start();
    await ready(apiPort, current);
    await put(apiPort, document(hosts, replicaPort));
    for (const h of hosts) await until(() => get(httpPort, h).then((s) => s === 200), 30_000, `${h} answering`);
    // Hosts answer (by Host) before the reload that brings their sites in: that reload, and its
    // old workers closing idle client connections, is not what is measured here.
    await until(() => sitesApplied(apiPort, hosts), 30_000, 'every site Applied');

    // The load alone, nothing replaced: what the client and Nginx give without a hand-over.
    const control = await underLoad(httpPort, hosts, async () => {
      await new Promise((r) => setTimeout(r, 1_000));
      return 1_000;
    });
    const takeOver = await underLoad(httpPort, hosts, async () => {
      const next = start(['--take-over', 'true']);
      const t = performance.now();
      const code = await current.exited;
      if (code !== 0)
        throw new Error(`the gateway taken over from exited ${code} (${String(current.proc.signalCode)}): ${current.out().slice(-2000)}`);
      const took = performance.now() - t;
      await ready(apiPort, next);
      current = next;
      return took;
    });
    const restart = await underLoad(httpPort, hosts, async () => {
      const t = performance.now();
      current.proc.kill('SIGTERM');
      await current.exited;
      const next = start();
      await ready(apiPort, next);
      current = next;
      return performance.now() - t;
    });
    current.proc.kill('SIGTERM');
    await current.exited;
    if (process.env.DSTACK_PROXY_BENCH_TAKEOVER_LOG) {
      const { readFileSync } = await import('node:fs');
      process.stderr.write(
        readFileSync(errorLogPath, 'utf8')
          .split('\n')
          .filter((l) => /\[(error|warn|alert|crit)\]/.test(l))
          .slice(0, 20)
          .join('\n'),
      );
    }
    const note = (w: Window): string =>
      `${w.failed} of ${w.answered + w.failed} requests failed, longest gap ${w.longestGapMs.toFixed(0)} ms, took ${(w.tookMs / 1000).toFixed(1)} s` +
      (w.samples.length ? ` (first failures: ${w.samples.join('; ')})` : '');
    return [
      {
        id: 'H1',
        name: `requests failed while a gateway with ${SERVICES} services is taken over (\`gateway --take-over true\`; ${CLIENTS} clients through Nginx)`,
        value: takeOver.failed,
        unit: 'requests',
        target: '0',
        ok: takeOver.failed === 0,
        baseline: { name: 'stop, then start a new one (a restart of the unit)', value: restart.failed, measured: 'same run' },
        note: `take-over: ${note(takeOver)}; restart: ${note(restart)}; nothing replaced (the load alone, 1 s): ${note(control)}; the old one drains for at most its --drain-period (10 s)`,
      },
      {
        id: 'H1g',
        name: 'longest time between two answers during that take-over',
        value: Math.round(takeOver.longestGapMs),
        unit: 'ms',
        target: '≤ 100 ms',
        ok: takeOver.longestGapMs <= 100,
        baseline: { name: 'stop, then start a new one', value: Math.round(restart.longestGapMs), measured: 'same run' },
      },
    ];
  } catch (err) {
    throw new Error(`${String(err)}\n${children.map((c) => c.out().slice(-1500)).join('\n---\n')}`);
  } finally {
    for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
    await execa(NGINX, ['-s', 'stop', '-p', prefix, '-c', confPath], { reject: false });
    replica.closeAllConnections();
    await new Promise((r) => replica.close(r));
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Runs `replace` under a steady load on every host; the load goes on AFTER_MS past it. */
async function underLoad(port: number, hosts: string[], replace: () => Promise<number>): Promise<Window> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CLIENTS });
  const w: Window = { failed: 0, answered: 0, longestGapMs: 0, tookMs: 0, samples: [] };
  let running = true;
  let last = performance.now();
  let n = 0;
  const client = async (): Promise<void> => {
    while (running) {
      const host = hosts[n++ % hosts.length]!;
      const r = await request(port, host, agent);
      const now = performance.now();
      if (r.status === 200) {
        w.answered++;
        w.longestGapMs = Math.max(w.longestGapMs, now - last);
        last = now;
      } else {
        w.failed++;
        if (w.samples.length < 3) w.samples.push(`${r.status} ${r.body.slice(0, 80)}`);
      }
    }
  };
  const clients = Array.from({ length: CLIENTS }, client);
  await new Promise((r) => setTimeout(r, 300));
  w.longestGapMs = 0;
  last = performance.now();
  try {
    w.tookMs = await replace();
    await new Promise((r) => setTimeout(r, AFTER_MS));
  } finally {
    running = false;
    await Promise.all(clients);
    agent.destroy();
  }
  return w;
}

function request(port: number, host: string, agent: http.Agent): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', (err) => resolve({ status: 0, body: String(err) }));
    });
    req.on('error', (err) => resolve({ status: 0, body: String(err) }));
  });
}

function get(port: number, host: string): Promise<number> {
  return request(port, host, new http.Agent()).then((r) => r.status);
}

function document(hosts: string[], replicaPort: number): unknown {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      projects: [{ name: 'main' }],
      services: hosts.map((domain, i) => ({
        project: 'main',
        run: `svc${i}`,
        domain,
        https: false,
        auth: false,
        replicas: [{ id: `r${i}`, appPort: replicaPort, direct: { host: '127.0.0.1', port: replicaPort } }],
      })),
    },
  };
}

async function sitesApplied(apiPort: number, hosts: string[]): Promise<boolean> {
  const r = await fetch(`http://127.0.0.1:${apiPort}/api/v1/status`);
  const s = (await r.json()) as { loops: Record<string, { objects: Record<string, { conditions: { type: string; reason?: string }[] }> }> };
  const objects = s.loops.nginx?.objects ?? {};
  return hosts.every((h) => objects[h]?.conditions.find((c) => c.type === 'Ready')?.reason === 'Applied');
}

async function put(apiPort: number, doc: unknown): Promise<void> {
  const r = await fetch(`http://127.0.0.1:${apiPort}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  if (r.status !== 200) throw new Error(`PUT answered ${r.status}: ${(await r.text()).slice(0, 500)}`);
}

/** Until /readyz answers 200, `c` alive (called when no other gateway is left to answer it). */
async function ready(apiPort: number, c: Child): Promise<void> {
  await until(
    async () => {
      if (c.proc.exitCode !== null) throw new Error(`the gateway exited ${c.proc.exitCode}: ${c.out().slice(-2000)}`);
      const r = await fetch(`http://127.0.0.1:${apiPort}/readyz`).catch(() => null);
      return r?.status === 200;
    },
    60_000,
    'the gateway ready',
  );
}

async function until(check: () => Promise<boolean>, limitMs: number, what: string): Promise<void> {
  const end = performance.now() + limitMs;
  while (!(await check())) {
    if (performance.now() > end) throw new Error(`no ${what} within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
