// Hand-over rows: a gateway with 100 services over the operator's Nginx (system mode, its own
// daemonised master on free ports of 127.0.0.1), a steady load through Nginx to all of them,
// and the gateway replaced while it runs: by `gateway --take-over true` started beside it, and,
// as the baseline, by stopping it and starting a new one (what dstack's update and a restart of
// its unit do). Then the same through an installed host's start script: an update, a rollback,
// a restart and a crash. Counted: requests that failed, and the longest time between two answers.

import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { readlink } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { CRASH_RESTART_AFTER_SECONDS, renderStartScript } from '../src/host/render.js';
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
  /** The management API, asked every 10 ms: the longest time without an answer. */
  apiLongestGapMs: number;
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
    const control = await underLoad(
      httpPort,
      hosts,
      async () => {
        await new Promise((r) => setTimeout(r, 1_000));
        return 1_000;
      },
      apiPort,
    );
    const takeOver = await underLoad(
      httpPort,
      hosts,
      async () => {
        const next = start(['--take-over', 'true']);
        const t = performance.now();
        const code = await current.exited;
        if (code !== 0)
          throw new Error(`the gateway taken over from exited ${code} (${String(current.proc.signalCode)}): ${current.out().slice(-2000)}`);
        const took = performance.now() - t;
        await ready(apiPort, next);
        current = next;
        return took;
      },
      apiPort,
    );
    const restart = await underLoad(
      httpPort,
      hosts,
      async () => {
        const t = performance.now();
        current.proc.kill('SIGTERM');
        await current.exited;
        const next = start();
        await ready(apiPort, next);
        current = next;
        return performance.now() - t;
      },
      apiPort,
    );
    current.proc.kill('SIGTERM');
    await current.exited;
    const unit = await unitWindows(dir, args, apiPort, httpPort, hosts);
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
      ...(
        [
          [
            'H2',
            "an update (the slot switched, SIGHUP to the unit's start script, as `host update` does after its install and check)",
            unit.update,
          ],
          ['H3', 'a rollback (switched back, SIGHUP)', unit.rollback],
          ['H4', '`systemctl restart` (SIGTERM to the start script, which exits; a new one started)', unit.restart],
        ] as const
      ).flatMap(([id, what, w]): Row[] => [
        {
          id,
          name: `requests failed during ${what}; ${SERVICES} services, ${CLIENTS} clients through Nginx`,
          value: w.failed,
          unit: 'requests',
          target: '0',
          ok: w.failed === 0,
          baseline: {
            name: "stop, then start a new one (dstack's update and restart: its app restarted)",
            value: restart.failed,
            measured: 'same run',
          },
          note: note(w),
        },
        {
          id: `${id}g`,
          name: `longest time between two answers during ${what.replace(/ \(.*$/, '')}`,
          value: Math.round(w.longestGapMs),
          unit: 'ms',
          target: '≤ 100 ms',
          ok: w.longestGapMs <= 100,
          baseline: { name: 'stop, then start a new one', value: Math.round(restart.longestGapMs), measured: 'same run' },
        },
      ]),
      {
        id: 'H4a',
        name: 'longest time the management API (/readyz, asked every 10 ms) did not answer during `systemctl restart`',
        value: Math.round(unit.restart.apiLongestGapMs),
        unit: 'ms',
        target: '≤ 250 ms',
        ok: unit.restart.apiLongestGapMs <= 250,
        baseline: { name: 'stop, then start a new one', value: Math.round(restart.apiLongestGapMs), measured: 'same run' },
        note: `an update: ${Math.round(unit.update.apiLongestGapMs)} ms; a rollback: ${Math.round(unit.rollback.apiLongestGapMs)} ms`,
      },
      {
        id: 'H5g',
        name: "longest time between two answers when the gateway is killed (SIGKILL) and the unit's start script starts it again",
        value: Math.round(unit.crash.longestGapMs),
        unit: 'ms',
        // Requests fail from the kill until the new process has bound its socket, which it does
        // before it is ready: the gap may not be longer than the time it took to be ready.
        target: `≤ ${Math.round(unit.crash.tookMs)} ms, the new gateway's time to ready`,
        ok: unit.crash.longestGapMs <= unit.crash.tookMs + READY_POLL_MS,
        baseline: { name: 'stop, then start a new one', value: Math.round(restart.longestGapMs), measured: 'same run' },
        note: note(unit.crash),
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
async function underLoad(port: number, hosts: string[], replace: () => Promise<number>, apiPort: number): Promise<Window> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CLIENTS });
  const w: Window = { failed: 0, answered: 0, longestGapMs: 0, tookMs: 0, samples: [], apiLongestGapMs: 0 };
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
        if (w.samples.length < 3) w.samples.push(`${r.status} ${r.body.replace(/\s+/g, ' ').slice(0, 80)}`);
      }
    }
  };
  let apiLast = performance.now();
  const management = async (): Promise<void> => {
    while (running) {
      const ok = (await fetch(`http://127.0.0.1:${apiPort}/readyz`).catch(() => null))?.status === 200;
      const now = performance.now();
      if (ok) {
        w.apiLongestGapMs = Math.max(w.apiLongestGapMs, now - apiLast);
        apiLast = now;
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const clients = [...Array.from({ length: CLIENTS }, client), management()];
  await new Promise((r) => setTimeout(r, 300));
  w.longestGapMs = 0;
  w.apiLongestGapMs = 0;
  last = performance.now();
  apiLast = performance.now();
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
    await new Promise((r) => setTimeout(r, READY_POLL_MS));
  }
}

/** How often `until` checks: the slack of a time measured with it. */
const READY_POLL_MS = 20;

/**
 * An installed host's unit without systemd: the host layout (both slots hold this build) and its
 * start script, run the way the unit runs it. Update and rollback switch the slot and send SIGHUP
 * (what `host update` does once its install and check passed, the old gateway serving throughout),
 * restart sends SIGTERM and starts the script again once it has exited (systemd's stop, then
 * start), and crash kills the serving gateway.
 */
async function unitWindows(
  dir: string,
  args: string[],
  apiPort: number,
  httpPort: number,
  hosts: string[],
): Promise<{ update: Window; rollback: Window; restart: Window; crash: Window }> {
  const root = path.join(dir, 'host');
  for (const slot of ['blue', 'green']) {
    mkdirSync(path.join(root, slot, 'node_modules'), { recursive: true });
    symlinkSync(process.execPath, path.join(root, slot, 'node'));
    symlinkSync(path.resolve('.'), path.join(root, slot, 'node_modules', 'dstack-proxy'));
  }
  // The same options as the gateways above, as the host's config.yaml (JSON is YAML).
  const config: Record<string, string> = {};
  const flags = args.slice(1);
  for (let i = 0; i < flags.length; i += 2)
    config[flags[i]!.slice(2).replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())] = flags[i + 1]!;
  writeFileSync(path.join(root, 'config.yaml'), JSON.stringify(config));
  writeFileSync(path.join(root, 'start'), renderStartScript(root));
  writeFileSync(path.join(root, 'version'), 'blue\n');
  const link = path.join(`${config.stateDir!}-nginx`, 'sockets', 'dataplane.sock');
  const servingPid = async (): Promise<number> => Number(/^instances\/(\d+)\./.exec(await readlink(link))?.[1]);
  const alive = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  let out = '';
  const script = (): ChildProcess => {
    const p = spawn('/bin/sh', [path.join(root, 'start')], { stdio: ['ignore', 'ignore', 'pipe'] });
    p.stderr!.on('data', (d: Buffer) => (out = (out + d.toString()).slice(-4000)));
    return p;
  };
  /** Until a gateway started at or after `since` serves the data plane and the API, and `old` is gone. */
  const replaced = (old: number, since: number): Promise<void> =>
    until(
      async () => {
        if ((await servingPid().catch(() => old)) === old || alive(old)) return false;
        const r = await fetch(`http://127.0.0.1:${apiPort}/readyz`).catch(() => null);
        return r?.status === 200 && ((await r.json()) as { startedAt: number }).startedAt >= since;
      },
      60_000,
      'the new gateway serving and the old one gone',
    ).catch((err: unknown) => {
      throw new Error(`${String(err)}\n${out}`);
    });
  let sh = script();
  try {
    await until(
      async () => (await fetch(`http://127.0.0.1:${apiPort}/readyz`).catch(() => null))?.status === 200,
      60_000,
      'the unit ready',
    );
    await until(() => sitesApplied(apiPort, hosts), 30_000, 'every site Applied');
    const hup = (slot: string) => async (): Promise<number> => {
      const [since, t, old] = [Date.now(), performance.now(), await servingPid()];
      writeFileSync(path.join(root, 'version'), `${slot}\n`);
      sh.kill('SIGHUP');
      await replaced(old, since);
      return performance.now() - t;
    };
    const update = await underLoad(httpPort, hosts, hup('green'), apiPort);
    const rollback = await underLoad(httpPort, hosts, hup('blue'), apiPort);
    const restart = await underLoad(
      httpPort,
      hosts,
      async () => {
        const [since, t, old] = [Date.now(), performance.now(), await servingPid()];
        const exited = new Promise((r) => sh.once('exit', r));
        sh.kill('SIGTERM');
        await exited;
        sh = script();
        await replaced(old, since);
        return performance.now() - t;
      },
      apiPort,
    );
    // Only a gateway that had run a while is started again by the script (sooner, systemd would).
    await new Promise((r) => setTimeout(r, (CRASH_RESTART_AFTER_SECONDS + 1) * 1000));
    const crash = await underLoad(
      httpPort,
      hosts,
      async () => {
        const [since, t, old] = [Date.now(), performance.now(), await servingPid()];
        process.kill(old, 'SIGKILL');
        await replaced(old, since);
        return performance.now() - t;
      },
      apiPort,
    );
    return { update, rollback, restart, crash };
  } finally {
    const last = await servingPid().catch(() => 0);
    sh.kill('SIGKILL');
    if (last > 0 && alive(last)) process.kill(last, 'SIGKILL');
  }
}
