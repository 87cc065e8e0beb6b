// The private Nginx: `nginx -t` and a supervised master process (its main conf is main-conf.ts;
// what /proc tells of its processes, procfs.ts).
// Also the system-mode counterparts (an operator-managed Nginx reloaded by a command).

import { open, readFile, stat, unlink } from 'node:fs/promises';
import { execa, type ResultPromise } from 'execa';
import type { Logger } from 'pino';
import { systemClock, type Clock, type TimerHandle } from '../../clock.js';
import { ProxyError } from '../../errors.js';

export const DEFAULT_NGINX_BIN = '/usr/sbin/nginx';
export { DEFAULT_WORKER_USER, GLOBAL_FILE, mainConfText, writeMainConf } from './main-conf.js';
export type { MainConfOptions, NginxPaths } from './main-conf.js';
import type { NginxPaths } from './main-conf.js';
import {
  acceptingWorkers,
  generationSwitched,
  masterFromPidFile,
  masterIdle,
  nginxOfPrefix,
  pause,
  procEntry,
  terminate,
  untilSwitched,
} from './procfs.js';

export type TestResult = { ok: true } | { ok: false; message: string; file?: string; line?: number };

/** Parse nginx -t output: the first [emerg]/[alert]/[crit] line, with its file and line. */
export function parseTestOutput(output: string): { message: string; file?: string; line?: number } {
  const lines = output
    .split('\n')
    .map((s) => s.trim())
    .filter(Boolean);
  const bad =
    lines.find((s) => /\[(emerg|alert|crit)\]/.test(s)) ??
    lines.find((s) => !/test (failed|is successful)|syntax is ok/.test(s)) ??
    'nginx -t failed';
  const message = bad.replace(/^nginx: /, '').replace(/^\S+ \S+ \[(emerg|alert|crit)\] \d+#\d+: /, '[$1] ');
  const m = / in (\/\S+):(\d+)$/.exec(message);
  return m && m[1] && m[2] ? { message, file: m[1], line: Number(m[2]) } : { message };
}

export type Exec = (file: string, args: readonly string[]) => Promise<{ exitCode?: number | undefined; stdout: string; stderr: string }>;

const defaultExec: Exec = (file, args) => execa(file, args, { reject: false, timeout: 60_000 });

/** `nginx -t -q -p <prefix> -c <conf>` → ok, or the first error with its file and line. */
export async function testConfig(confPath: string, prefix: string, opts: { nginxBin?: string; exec?: Exec } = {}): Promise<TestResult> {
  const exec = opts.exec ?? defaultExec;
  const r = await exec(opts.nginxBin ?? DEFAULT_NGINX_BIN, ['-t', '-q', '-p', prefix, '-c', confPath]);
  if (r.exitCode === 0) return { ok: true };
  return { ok: false, ...parseTestOutput(`${r.stderr}\n${r.stdout}`) };
}

/** Split a command line into argv (whitespace-separated, '…' and "…" quoting); no shell involved. */
export function splitCommand(cmd: string): string[] {
  const out: string[] = [];
  const re = /"([^"]*)"|'([^']*)'|(\S+)/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(cmd)) !== null) out.push(m[1] ?? m[2] ?? m[3] ?? '');
  if (out.length === 0) throw new ProxyError('DP_ERR_BAD_OPTION', 'empty command');
  return out;
}

/** System mode: an Nginx the operator runs; we only test candidates and run its reload command. */
export function systemNginx(
  opts: {
    reloadCommand?: string;
    testCommand?: string;
    exec?: Exec;
    /** The system master's pid file (default: the `pid` of nginxConf); lets reload() wait for its new workers. */
    pidFile?: string;
    nginxConf?: string;
    /** How long reload() waits for the previous workers to stop accepting. Default 15 s. */
    timeoutMs?: number;
  } = {},
) {
  const exec = opts.exec ?? defaultExec;
  const timeoutMs = opts.timeoutMs ?? 15_000;
  const reloadArgv = splitCommand(opts.reloadCommand ?? 'nginx -s reload');
  const testArgv = splitCommand(opts.testCommand ?? 'nginx -t');
  return {
    /** Runs the test command with `-c <candidate conf>` appended. */
    async test(confPath: string): Promise<TestResult> {
      const [bin, ...args] = testArgv as [string, ...string[]];
      const r = await exec(bin, [...args, '-c', confPath]);
      return r.exitCode === 0 ? { ok: true } : { ok: false, ...parseTestOutput(`${r.stderr}\n${r.stdout}`) };
    },
    /**
     * Runs the reload command. It returns once the signal is sent, while workers of the
     * previous config still accept: when the master is known (its pid file), wait until they
     * stopped and new ones run, so "applied" means served.
     */
    async reload(hint?: ReloadHint): Promise<ReloadOutcome> {
      const pidFile = opts.pidFile ?? (opts.nginxConf ? await pidFileOf(opts.nginxConf) : undefined);
      const master = pidFile ? await masterFromPidFile(pidFile) : undefined;
      const old = master ? await acceptingWorkers(master) : [];
      const [bin, ...args] = reloadArgv as [string, ...string[]];
      const t0 = Date.now();
      const r = await exec(bin, args);
      if (r.exitCode !== 0) throw new Error(`${reloadArgv.join(' ')} exited ${r.exitCode}: ${r.stderr.trim()}`);
      if (master === undefined) return;
      if (await untilSwitched(master, old, reloadDeadline(t0, timeoutMs, hint))) return;
      return unconfirmed(master, old, Date.now() - t0);
    },
  };
}

export type NginxEvent =
  | { type: 'started'; pid: number }
  | { type: 'exited'; code: number | null; signal: string | null; expected: boolean }
  | { type: 'restarting'; attempt: number; delayMs: number }
  | { type: 'restart-failed'; attempt: number; error: string }
  | { type: 'reloaded' }
  | { type: 'stale-stopped'; pids: number[]; killed: number[] };

/** What the supervisor knows about its master, for the status and /metrics. */
export interface NginxProcessInfo {
  /** A master is up and serving (it wrote its pid). */
  running: boolean;
  pid: number | undefined;
  /** Successful restarts after an unexpected exit. */
  restarts: number;
  /** Nginx processes of this prefix left by someone else (a killed gateway or master), stopped. */
  staleStopped: number;
  lastExit: { code: number | null; signal: string | null; at: number } | null;
  /** The last restart attempt that failed, while no master runs. */
  restartError: string | null;
}

export interface NginxProcessOptions {
  paths: NginxPaths;
  nginxBin?: string;
  logger?: Logger;
  onEvent?: (e: NginxEvent) => void;
  /** Restart backoff: initialMs doubling up to maxMs. Defaults 200 ms, 30 s. */
  restartInitialMs?: number;
  restartMaxMs?: number;
  /** How long start() and reload() wait for Nginx. Default 15 s (a busy bind retries 5 × 500 ms). */
  timeoutMs?: number;
  /** How long a stale Nginx of this prefix gets after SIGTERM before SIGKILL. Default 2 s. */
  staleGraceMs?: number;
  /**
   * The restart backoff, the wait for a restart, the kill timer of stop() and the time of an
   * exit. Default: the system clock. The polls that watch Nginx itself (its pid file, its log,
   * its workers) run on real time: they wait for a real process, which moves on its own, and
   * their timers keep the process alive while nothing else does (a start before the API listens).
   */
  clock?: Clock;
}

/** A wait that ran past its deadline (as opposed to a refusal reported by Nginx). */
class WaitTimeout extends Error {}

async function waitFor<T>(deadline: number, check: () => Promise<T | undefined>, what: string): Promise<T> {
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new WaitTimeout(`timed out waiting for ${what}`);
    await pause(20);
  }
}

async function readFrom(path: string, offset: number): Promise<string> {
  const fh = await open(path, 'r').catch(() => null);
  if (!fh) return '';
  try {
    const { size } = await fh.stat();
    if (size <= offset) return '';
    const buf = Buffer.alloc(size - offset);
    await fh.read(buf, 0, buf.length, offset);
    return buf.toString('utf8');
  } finally {
    await fh.close();
  }
}

/**
 * What a reload ended with when Nginx took the new config but workers of the previous one
 * still accept connections at the deadline: the sites are not reported served yet, and
 * settled() tells later whether they are by now.
 */
export interface ReloadUnconfirmed {
  unconfirmed: string;
  settled: () => Promise<boolean>;
}

/** A reload's outcome: undefined = every new connection gets the new config. */
export type ReloadOutcome = void | ReloadUnconfirmed;

/**
 * What the caller knows of the reload to come: how long `nginx -t` of the same files just
 * took. The master parses the same files before it starts new workers, so the wait for the
 * reload is scaled on it: a config of many thousand sites takes longer than any fixed timeout.
 */
export interface ReloadHint {
  testMs?: number;
}

/** How many times the duration of the test a reload may take before it counts as late. */
const RELOAD_PER_TEST = 3;

/** The deadline of a reload started at t0: the fixed timeout, or longer when the test was slow. */
function reloadDeadline(t0: number, timeoutMs: number, hint: ReloadHint | undefined): number {
  const testMs = hint?.testMs;
  const scaled = testMs !== undefined && Number.isFinite(testMs) && testMs > 0 ? RELOAD_PER_TEST * testMs : 0;
  return t0 + Math.max(timeoutMs, scaled);
}

function unconfirmed(master: number, old: readonly number[], waitedMs: number): ReloadUnconfirmed {
  return {
    unconfirmed: `nginx took the new config, but after ${Math.round(waitedMs / 1000)} s workers of the previous one (pid ${old.join(', ')}) still accept connections`,
    settled: () => generationSwitched(master, old),
  };
}

/** The `pid` directive of a main conf, or Debian's compiled-in default. */
export async function pidFileOf(mainConfPath: string): Promise<string> {
  const text = await readFile(mainConfPath, 'utf8').catch(() => '');
  const m = /^\s*pid\s+("[^"]+"|'[^']+'|[^\s;]+)\s*;/m.exec(text);
  return m?.[1] ? m[1].replace(/^["']|["']$/g, '') : '/run/nginx.pid';
}

async function sizeOf(path: string): Promise<number> {
  return stat(path).then(
    (s) => s.size,
    () => 0,
  );
}

/**
 * A supervised Nginx master (`-g 'daemon off;'`): restarted with backoff when it dies
 * unexpectedly; reload() sends SIGHUP and waits for the new workers (or the [emerg] that
 * refused the new config, which keeps the old one serving).
 *
 * Before every start and restart it stops whatever Nginx of its prefix it did not start
 * itself: the master of a gateway killed with SIGKILL (it survives with ppid 1, holding the
 * ports) and the workers of a master killed with SIGKILL (they keep serving the old config).
 * Otherwise the new master could not bind, and every later reload would fail.
 */
export class NginxProcess {
  private child: ResultPromise | null = null;
  /** The master's pid once it is serving; undefined while (re)starting or stopped. */
  private readyPid: number | undefined;
  private stopping = false;
  private attempt = 0;
  private restartTimer: TimerHandle | null = null;
  private waiters: { resolve: () => void; reject: (e: Error) => void }[] = [];
  private counts = { restarts: 0, staleStopped: 0 };
  private lastExit: NginxProcessInfo['lastExit'] = null;
  private restartError: string | null = null;
  private readonly o: Required<Omit<NginxProcessOptions, 'logger' | 'onEvent'>> & Pick<NginxProcessOptions, 'logger' | 'onEvent'>;

  constructor(opts: NginxProcessOptions) {
    this.o = {
      nginxBin: DEFAULT_NGINX_BIN,
      restartInitialMs: 200,
      restartMaxMs: 30_000,
      timeoutMs: 15_000,
      staleGraceMs: 2_000,
      clock: systemClock,
      ...opts,
    };
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  get info(): NginxProcessInfo {
    return {
      running: this.readyPid !== undefined,
      pid: this.readyPid,
      restarts: this.counts.restarts,
      staleStopped: this.counts.staleStopped,
      lastExit: this.lastExit,
      restartError: this.readyPid === undefined ? this.restartError : null,
    };
  }

  /** Test the config, start the master and wait until it wrote its pid (sockets are bound). */
  async start(): Promise<void> {
    const { paths, nginxBin } = this.o;
    const t = await testConfig(paths.confPath, paths.prefix, { nginxBin });
    if (!t.ok) throw new ProxyError('DP_ERR_BAD_OPTION', `nginx config invalid: ${t.message}`);
    this.stopping = false;
    await this.spawn(false);
  }

  /**
   * Stop every Nginx of this prefix other than our own master and its workers (SIGTERM, then
   * SIGKILL after staleGraceMs). Identified by /proc, never by the pid file alone: a pid in
   * nginx.pid may belong to an unrelated process by now.
   */
  private async stopStale(): Promise<void> {
    const own = this.readyPid;
    const stale = (await nginxOfPrefix(this.o.paths)).filter((p) => p.pid !== own && (own === undefined || p.ppid !== own));
    if (stale.length === 0) return;
    const pidFile = Number((await readFile(this.o.paths.pidPath, 'utf8').catch(() => '')).trim());
    const pids = stale.map((p) => p.pid);
    this.o.logger?.warn(
      { pids, pidFileMaster: pids.includes(pidFile) ? pidFile : undefined, prefix: this.o.paths.prefix },
      'stopping Nginx processes of this prefix left by a previous gateway or master',
    );
    const { killed, left } = await terminate(stale, this.o.staleGraceMs);
    this.counts.staleStopped += stale.length - left.length;
    this.o.onEvent?.({ type: 'stale-stopped', pids, killed });
    if (left.length > 0) throw new Error(`could not stop the previous Nginx processes ${left.join(', ')} of ${this.o.paths.prefix}`);
  }

  private async spawn(restart: boolean): Promise<void> {
    const { paths, nginxBin } = this.o;
    await this.stopStale();
    // A master killed outright leaves its socket files behind, and bind() would then fail.
    for (const p of paths.unixListeners ?? []) await unlink(p).catch(() => undefined);
    const child = execa(nginxBin, ['-p', paths.prefix, '-c', paths.confPath, '-g', 'daemon off;'], {
      reject: false,
      stdin: 'ignore',
      stdout: 'ignore',
      stderr: 'pipe',
      cleanup: true,
    });
    this.child = child;
    let exited = false;
    let ready = false;
    void child.then((r) => {
      exited = true;
      if (this.child !== child) return;
      this.child = null;
      this.readyPid = undefined;
      // Before it was ready, spawn() itself reports the failure.
      if (ready) this.onExit(r.exitCode ?? null, r.signal ?? null, r.stderr?.toString() ?? '');
    });
    const pid = child.pid;
    if (pid === undefined) throw new Error('nginx did not start');
    try {
      await waitFor(
        Date.now() + this.o.timeoutMs,
        async () => {
          if (exited) throw new Error(`nginx exited at start: ${(await child).stderr?.toString().trim()}`);
          const txt = await readFile(paths.pidPath, 'utf8').catch(() => '');
          return txt.trim() === String(pid) ? true : undefined;
        },
        'nginx to start',
      );
    } catch (err) {
      if (!exited) child.kill('SIGKILL');
      if (this.child === child) this.child = null;
      throw err;
    }
    ready = true;
    this.readyPid = pid;
    this.restartError = null;
    if (restart) this.counts.restarts++;
    this.o.logger?.info({ pid }, 'nginx started');
    this.o.onEvent?.({ type: 'started', pid });
    for (const w of this.waiters.splice(0)) w.resolve();
  }

  private onExit(code: number | null, signal: string | null, stderr: string): void {
    const expected = this.stopping;
    if (!expected) this.lastExit = { code, signal, at: this.o.clock.now() };
    this.o.onEvent?.({ type: 'exited', code, signal, expected });
    if (expected) return;
    this.o.logger?.error({ code, signal, stderr: stderr.slice(-2000) }, 'nginx exited unexpectedly');
    this.scheduleRestart();
  }

  private scheduleRestart(): void {
    this.attempt += 1;
    const delayMs = Math.min(this.o.restartMaxMs, this.o.restartInitialMs * 2 ** (this.attempt - 1));
    this.o.onEvent?.({ type: 'restarting', attempt: this.attempt, delayMs });
    this.restartTimer = this.o.clock.setTimeout(() => {
      this.restartTimer = null;
      if (this.stopping) return;
      this.spawn(true).then(
        () => {
          this.attempt = 0;
        },
        (err: unknown) => {
          const error = err instanceof Error ? err.message : String(err);
          this.restartError = error;
          this.o.logger?.error({ err: error, attempt: this.attempt }, 'nginx restart failed');
          this.o.onEvent?.({ type: 'restart-failed', attempt: this.attempt, error });
          if (!this.stopping) this.scheduleRestart();
        },
      );
    }, delayMs);
  }

  /**
   * The pid of a serving master. While a restart is under way (the master died), wait for it:
   * the new master reads the files as they are now, so a change written meanwhile is not
   * lost to a "not running" failure and a rollback.
   */
  private async runningPid(): Promise<number> {
    if (this.readyPid !== undefined) return this.readyPid;
    if (this.stopping) throw new Error('nginx is not running');
    await new Promise<void>((resolvePromise, reject) => {
      const waiter = { resolve: resolvePromise, reject };
      this.waiters.push(waiter);
      this.o.clock.setTimeout(() => {
        const i = this.waiters.indexOf(waiter);
        if (i < 0) return;
        this.waiters.splice(i, 1);
        reject(new Error(`nginx is not running${this.restartError ? ` (restart failed: ${this.restartError})` : ' (restarting)'}`));
      }, this.o.timeoutMs);
    });
    if (this.readyPid === undefined) throw new Error('nginx is not running');
    return this.readyPid;
  }

  /**
   * SIGHUP the master; resolve once the new workers started and every old worker closed its
   * listening sockets (its title turns to "worker process is shutting down"), so the next
   * connection is served by the new config. Reject with the [emerg] if Nginx refused it.
   */
  async reload(hint?: ReloadHint): Promise<ReloadOutcome> {
    const log = this.o.paths.errorLogPath;
    const t0 = Date.now();
    const deadline = reloadDeadline(t0, this.o.timeoutMs, hint);
    let pid: number;
    let offset: number;
    let oldWorkers: number[];
    for (;;) {
      pid = await this.runningPid();
      offset = await sizeOf(log);
      oldWorkers = await acceptingWorkers(pid);
      try {
        process.kill(pid, 'SIGHUP');
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
        // The master died and its exit has not been noticed yet: wait for that, then for the restart.
        const dead = pid;
        await waitFor(deadline, async () => (this.readyPid !== dead ? true : undefined), 'the exit of nginx to be noticed');
      }
    }
    // 1. The master took the new config and started its workers, or refused it. Past the
    //    deadline it may still be parsing the files: they must stay as they are (a rollback
    //    would delete files it is about to open, fail this reload and start another), so the
    //    reload is reported unconfirmed, never failed, while the master lives.
    const took = await waitFor(
      deadline,
      async () => {
        const out = await readFrom(log, offset);
        if (!/reconfiguring/.test(out)) return undefined; // the master has not picked up the signal yet
        const bad = /\[(emerg|alert)\][^\n]*/.exec(out);
        if (bad) {
          // Wait for the master to finish the attempt (bind() retries 5 × 500 ms) before
          // reporting, so the next reload does not read this attempt's errors.
          if (!(await masterIdle(pid))) return undefined;
          throw new Error(`nginx refused the reload: ${bad[0]}`);
        }
        return /start worker process/.test(out) ? true : undefined;
      },
      'nginx to reload',
    ).catch(async (err: unknown) => {
      const master = err instanceof WaitTimeout ? await procEntry(pid) : null;
      if (!master || master.state === 'Z') throw err;
      return false;
    });
    if (!took) {
      this.o.onEvent?.({ type: 'reloaded' });
      return {
        unconfirmed: `nginx has not finished reading the new config after ${Math.round((Date.now() - t0) / 1000)} s`,
        settled: () => generationSwitched(pid, oldWorkers),
      };
    }
    // 2. No worker of the previous config accepts any more. Past the deadline the new config
    //    is in (no rollback), but not yet what every new connection gets: say so.
    const switched = await untilSwitched(pid, oldWorkers, deadline);
    this.o.onEvent?.({ type: 'reloaded' });
    return switched ? undefined : unconfirmed(pid, oldWorkers, Date.now() - t0);
  }

  /** Stop the master (SIGQUIT: graceful; SIGTERM: fast) and wait for it to exit. */
  async stop(opts: { graceful?: boolean } = {}): Promise<void> {
    this.stopping = true;
    if (this.restartTimer !== null) this.o.clock.clearTimeout(this.restartTimer);
    this.restartTimer = null;
    for (const w of this.waiters.splice(0)) w.reject(new Error('nginx is stopping'));
    const child = this.child;
    if (!child) return;
    child.kill(opts.graceful ? 'SIGQUIT' : 'SIGTERM');
    const timer = this.o.clock.setTimeout(() => child.kill('SIGKILL'), this.o.timeoutMs);
    await child;
    this.o.clock.clearTimeout(timer);
  }
}
