// The private Nginx: its main conf, `nginx -t`, and a supervised master process. Also the
// system-mode counterparts (an operator-managed Nginx reloaded by a command).

import { mkdir, open, readFile, readdir, stat, unlink, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { execa, type ResultPromise } from 'execa';
import type { Logger } from 'pino';
import { ProxyError } from '../../errors.js';
import { GLOBAL_FILE, SITES_SUBDIR, quote } from './names.js';

export const DEFAULT_NGINX_BIN = '/usr/sbin/nginx';
export const DEFAULT_WORKER_USER = 'www-data';

export interface MainConfOptions {
  /** The managed conf dir (global file + sites/). Default <dir>/conf.d. */
  confDir?: string;
  workerProcesses?: number | 'auto';
  workerConnections?: number;
  /**
   * The user the workers run as: they face the internet, so when the master runs as root it is
   * DEFAULT_WORKER_USER unless told otherwise; not root, no `user` line (Nginx could not switch).
   * The workers then reach by path only what the gateway gives that user: see src/gateway/nginx-worker.ts.
   */
  user?: string | null;
  /** Where client_body_temp and the other temp dirs go (the workers write there). Default <dir>/tmp. */
  tempDir?: string;
  /** Must be notice or more verbose: NginxProcess.reload() reads the reload outcome from it. */
  errorLogLevel?: 'debug' | 'info' | 'notice';
  /** Set server_names_hash_* here (1,000s of sites). Default true. */
  serverNamesHash?: boolean;
  /** How long old workers may keep serving long requests after a reload; null = forever. */
  workerShutdownTimeoutSec?: number | null;
  /** Unix sockets the sites listen on: removed before each start (Nginx does not unlink before bind). */
  unixListeners?: string[];
}

export interface NginxPaths {
  prefix: string;
  confPath: string;
  confDir: string;
  pidPath: string;
  errorLogPath: string;
  tempDir: string;
  /** MainConfOptions.unixListeners. */
  unixListeners?: string[];
}

const TEMP_KINDS = ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'] as const;

/** The main nginx.conf text for a private Nginx under `dir` (TESTING.md "Private Nginx"). */
export function mainConfText(dir: string, opts: MainConfOptions = {}): { text: string; paths: NginxPaths } {
  const prefix = resolve(dir);
  const confDir = resolve(opts.confDir ?? join(prefix, 'conf.d'));
  const tempDir = resolve(opts.tempDir ?? join(prefix, 'tmp'));
  const paths: NginxPaths = {
    prefix,
    confPath: join(prefix, 'nginx.conf'),
    confDir,
    pidPath: join(prefix, 'nginx.pid'),
    errorLogPath: join(prefix, 'logs', 'error.log'),
    tempDir,
    ...(opts.unixListeners ? { unixListeners: opts.unixListeners } : {}),
  };
  const user = opts.user === undefined ? (process.getuid?.() === 0 ? DEFAULT_WORKER_USER : null) : opts.user;
  const workers = opts.workerProcesses ?? 1;
  if (workers !== 'auto' && (!Number.isInteger(workers) || workers < 1)) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `workerProcesses must be a positive integer or "auto"`);
  }
  const tmp = (k: string) => quote(join(tempDir, k));
  const l = [
    '# main conf of the private Nginx run by dstack-proxy; rewritten at every start',
    `worker_processes ${workers};`,
    `pid ${quote(paths.pidPath)};`,
    `error_log ${quote(paths.errorLogPath)} ${opts.errorLogLevel ?? 'notice'};`,
  ];
  if (user) l.push(`user ${quote(user)};`);
  if (opts.workerShutdownTimeoutSec != null) l.push(`worker_shutdown_timeout ${opts.workerShutdownTimeoutSec}s;`);
  l.push(`events { worker_connections ${opts.workerConnections ?? 4096}; }`, 'http {');
  l.push(
    `    client_body_temp_path ${tmp('body')};`,
    `    proxy_temp_path ${tmp('proxy')};`,
    `    fastcgi_temp_path ${tmp('fastcgi')};`,
    `    uwsgi_temp_path ${tmp('uwsgi')};`,
    `    scgi_temp_path ${tmp('scgi')};`,
    '    access_log off;',
    '    server_tokens off;',
    '    sendfile on;',
    '    tcp_nodelay on;',
  );
  if (opts.serverNamesHash ?? true) {
    l.push('    server_names_hash_bucket_size 128;', '    server_names_hash_max_size 65536;');
  }
  // The global file first (log_format must precede the access_log lines that use it).
  l.push(`    include ${quote(join(confDir, '*.conf'))};`, `    include ${quote(join(confDir, SITES_SUBDIR, '*.conf'))};`, '}');
  return { text: `${l.join('\n')}\n`, paths };
}

/** Write nginx.conf and create the directories a private Nginx needs. */
export async function writeMainConf(dir: string, opts: MainConfOptions = {}): Promise<NginxPaths> {
  const { text, paths } = mainConfText(dir, opts);
  await mkdir(join(paths.prefix, 'logs'), { recursive: true });
  // Nginx's master makes the temp dirs its workers' own at start (when it switches users).
  for (const k of TEMP_KINDS) await mkdir(join(paths.tempDir, k), { recursive: true, mode: 0o700 });
  await mkdir(join(paths.confDir, SITES_SUBDIR), { recursive: true });
  await writeFile(paths.confPath, text, { mode: 0o644 });
  return paths;
}

export { GLOBAL_FILE };

export type TestResult = { ok: true } | { ok: false; message: string; file?: string; line?: number };

/** Parse nginx -t output: the first [emerg]/[alert]/[crit] line, with its file and line. */
export function parseTestOutput(output: string): { message: string; file?: string; line?: number } {
  const lines = output.split('\n').map((s) => s.trim()).filter(Boolean);
  const bad = lines.find((s) => /\[(emerg|alert|crit)\]/.test(s)) ?? lines.find((s) => !/test (failed|is successful)|syntax is ok/.test(s)) ?? 'nginx -t failed';
  const message = bad.replace(/^nginx: /, '').replace(/^\S+ \S+ \[(emerg|alert|crit)\] \d+#\d+: /, '[$1] ');
  const m = / in (\/\S+):(\d+)$/.exec(message);
  return m && m[1] && m[2] ? { message, file: m[1], line: Number(m[2]) } : { message };
}

export type Exec = (file: string, args: readonly string[]) => Promise<{ exitCode?: number | undefined; stdout: string; stderr: string }>;

const defaultExec: Exec = (file, args) => execa(file, args, { reject: false, timeout: 60_000 });

/** `nginx -t -q -p <prefix> -c <conf>` → ok, or the first error with its file and line. */
export async function testConfig(
  confPath: string,
  prefix: string,
  opts: { nginxBin?: string; exec?: Exec } = {},
): Promise<TestResult> {
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
export function systemNginx(opts: { reloadCommand?: string; testCommand?: string; exec?: Exec } = {}) {
  const exec = opts.exec ?? defaultExec;
  const reloadArgv = splitCommand(opts.reloadCommand ?? 'nginx -s reload');
  const testArgv = splitCommand(opts.testCommand ?? 'nginx -t');
  return {
    /** Runs the test command with `-c <candidate conf>` appended. */
    async test(confPath: string): Promise<TestResult> {
      const [bin, ...args] = testArgv as [string, ...string[]];
      const r = await exec(bin, [...args, '-c', confPath]);
      return r.exitCode === 0 ? { ok: true } : { ok: false, ...parseTestOutput(`${r.stderr}\n${r.stdout}`) };
    },
    async reload(): Promise<void> {
      const [bin, ...args] = reloadArgv as [string, ...string[]];
      const r = await exec(bin, args);
      if (r.exitCode !== 0) throw new Error(`${reloadArgv.join(' ')} exited ${r.exitCode}: ${r.stderr.trim()}`);
    },
  };
}

export type NginxEvent =
  | { type: 'started'; pid: number }
  | { type: 'exited'; code: number | null; signal: string | null; expected: boolean }
  | { type: 'restarting'; attempt: number; delayMs: number }
  | { type: 'restart-failed'; attempt: number; error: string }
  | { type: 'reloaded' };

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
}

async function waitFor<T>(deadline: number, check: () => Promise<T | undefined>, what: string): Promise<T> {
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
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

/** The master waits for signals in sigsuspend between reconfigurations (true when unknown). */
async function masterIdle(pid: number): Promise<boolean> {
  const wchan = await readFile(`/proc/${pid}/wchan`, 'utf8').catch(() => '');
  if (!/^[a-z_]/.test(wchan)) return true; // wchan hidden: cannot tell, don't wait
  return wchan.includes('sigsuspend');
}

/** PIDs whose parent is `pid` (scan of /proc). */
async function childrenOf(pid: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    // "pid (comm) state ppid ..." — comm may hold spaces, so parse after the last ')'.
    const ppid = st.slice(st.lastIndexOf(')') + 2).split(' ')[1];
    if (ppid === String(pid)) out.push(Number(name));
  }
  return out;
}

async function sizeOf(path: string): Promise<number> {
  return stat(path).then((s) => s.size, () => 0);
}

/**
 * A supervised Nginx master (`-g 'daemon off;'`): restarted with backoff when it dies
 * unexpectedly; reload() sends SIGHUP and waits for the new workers (or the [emerg] that
 * refused the new config, which keeps the old one serving).
 */
export class NginxProcess {
  private child: ResultPromise | null = null;
  private stopping = false;
  private attempt = 0;
  private restartTimer: NodeJS.Timeout | null = null;
  private readonly o: Required<Omit<NginxProcessOptions, 'logger' | 'onEvent'>> & Pick<NginxProcessOptions, 'logger' | 'onEvent'>;

  constructor(opts: NginxProcessOptions) {
    this.o = {
      nginxBin: DEFAULT_NGINX_BIN,
      restartInitialMs: 200,
      restartMaxMs: 30_000,
      timeoutMs: 15_000,
      ...opts,
    };
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Test the config, start the master and wait until it wrote its pid (sockets are bound). */
  async start(): Promise<void> {
    const { paths, nginxBin } = this.o;
    const t = await testConfig(paths.confPath, paths.prefix, { nginxBin });
    if (!t.ok) throw new ProxyError('DP_ERR_BAD_OPTION', `nginx config invalid: ${t.message}`);
    this.stopping = false;
    await this.spawn();
  }

  private async spawn(): Promise<void> {
    const { paths, nginxBin } = this.o;
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
    this.o.logger?.info({ pid }, 'nginx started');
    this.o.onEvent?.({ type: 'started', pid });
  }

  private onExit(code: number | null, signal: string | null, stderr: string): void {
    const expected = this.stopping;
    this.o.onEvent?.({ type: 'exited', code, signal, expected });
    if (expected) return;
    this.o.logger?.error({ code, signal, stderr: stderr.slice(-2000) }, 'nginx exited unexpectedly');
    this.scheduleRestart();
  }

  private scheduleRestart(): void {
    this.attempt += 1;
    const delayMs = Math.min(this.o.restartMaxMs, this.o.restartInitialMs * 2 ** (this.attempt - 1));
    this.o.onEvent?.({ type: 'restarting', attempt: this.attempt, delayMs });
    this.restartTimer = setTimeout(() => {
      this.restartTimer = null;
      if (this.stopping) return;
      this.spawn().then(
        () => {
          this.attempt = 0;
        },
        (err: unknown) => {
          const error = err instanceof Error ? err.message : String(err);
          this.o.logger?.error({ err: error, attempt: this.attempt }, 'nginx restart failed');
          this.o.onEvent?.({ type: 'restart-failed', attempt: this.attempt, error });
          if (!this.stopping) this.scheduleRestart();
        },
      );
    }, delayMs);
  }

  /**
   * SIGHUP the master; resolve once the new workers started and every old worker closed its
   * listening sockets (its title turns to "worker process is shutting down"), so the next
   * connection is served by the new config. Reject with the [emerg] if Nginx refused it.
   */
  async reload(): Promise<void> {
    const pid = this.child?.pid;
    if (pid === undefined) throw new Error('nginx is not running');
    const log = this.o.paths.errorLogPath;
    const offset = await sizeOf(log);
    const oldWorkers = await childrenOf(pid);
    process.kill(pid, 'SIGHUP');
    await waitFor(
      Date.now() + this.o.timeoutMs,
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
        if (!/start worker process/.test(out)) return undefined;
        for (const w of oldWorkers) {
          const title = await readFile(`/proc/${w}/cmdline`, 'utf8').catch(() => '');
          if (title.includes('worker process') && !title.includes('shutting down')) return undefined;
        }
        return true;
      },
      'nginx to reload',
    );
    this.o.onEvent?.({ type: 'reloaded' });
  }

  /** Stop the master (SIGQUIT: graceful; SIGTERM: fast) and wait for it to exit. */
  async stop(opts: { graceful?: boolean } = {}): Promise<void> {
    this.stopping = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    this.restartTimer = null;
    const child = this.child;
    if (!child) return;
    child.kill(opts.graceful ? 'SIGQUIT' : 'SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), this.o.timeoutMs);
    await child;
    clearTimeout(timer);
  }
}
