// Runs `certbot certonly --webroot`: non-interactive, one at a time, with its
// config/work/logs dirs under the state dir, and a timeout that kills certbot's whole process
// group (it is started in its own session) so nothing is left holding certbot's lock.
// The EAB HMAC key goes to certbot through a 0600 config file, never argv (visible in `ps`), and
// is scrubbed from anything certbot prints before it reaches a log, a status or an error.

import { mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { systemClock, type Clock } from '../../clock.js';

/** A secret that prints as `<redacted>` in JSON, logs and string conversions. */
export interface Secret {
  reveal(): string;
  /** `<redacted>`: what any string conversion of it gives. */
  toString(): string;
  /** `<redacted>`. */
  toJSON(): string;
}

export function secret(value: string): Secret {
  const s = {
    reveal: () => value,
    toJSON: () => '<redacted>',
    toString: () => '<redacted>',
    [Symbol.for('nodejs.util.inspect.custom')]: () => '<redacted>',
  };
  return s;
}

export interface AcmeSettings {
  server: string;
  email?: string;
  eab?: { kid: string; hmacKey: Secret };
}

export interface CertbotDirs {
  configDir: string;
  workDir: string;
  logsDir: string;
}

export interface CertbotRequest {
  domain: string;
  acme: AcmeSettings;
  webroot: string;
  dirs: CertbotDirs;
  /** Replace a lineage that is still valid (renewal decided by us, not by certbot). */
  force: boolean;
  /**
   * Key authorizations go through certbot's manual hooks into a store the whole fleet reads
   * (their environment: where to), besides this webroot; absent: certbot writes the webroot.
   */
  sharedChallenges?: { env: Record<string, string> };
}

export type CertbotResult = { ok: true; durationMs: number } | { ok: false; durationMs: number; timedOut: boolean; error: string };

export interface CertbotRunnerOptions {
  /** Default 'certbot'. */
  certbotBin?: string;
  /** Default 40_000 (40 s); then certbot's process group gets SIGTERM, and SIGKILL 2 s later. */
  timeoutMs?: number;
  /** Extra environment, e.g. REQUESTS_CA_BUNDLE for a test CA. */
  env?: Record<string, string>;
}

export const DEFAULT_CERTBOT_TIMEOUT_MS = 40_000; // 40 s
const KILL_GRACE_MS = 2_000; // 2 s between SIGTERM and SIGKILL of the group

/** certbot's command line for a request (no secrets: EAB goes through `--config <file>`). */
export function certbotArgs(req: CertbotRequest, configFile: string | null, hookScript: string | null = null): string[] {
  const args = ['certonly', '--non-interactive', '--agree-tos'];
  if (hookScript) {
    args.push('--manual', '--preferred-challenges', 'http');
    args.push('--manual-auth-hook', `${hookScript} auth`, '--manual-cleanup-hook', `${hookScript} cleanup`);
  } else {
    args.push('--webroot', '-w', req.webroot);
  }
  args.push('-d', req.domain, '--cert-name', req.domain);
  args.push('--server', req.acme.server);
  args.push('--config-dir', req.dirs.configDir, '--work-dir', req.dirs.workDir, '--logs-dir', req.dirs.logsDir);
  if (configFile) args.push('--config', configFile);
  if (req.acme.email) args.push('--email', req.acme.email, '--no-eff-email');
  else args.push('--register-unsafely-without-email');
  if (req.force) args.push('--force-renewal');
  return args;
}

/**
 * The built hook script: beside this module once built, and under dist/ when this module runs
 * from its TypeScript source (the tests); certbot runs it with this same Node.
 */
export function challengeHookPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const built = here.includes(`${sep}dist${sep}`) ? here : here.replace(/([\\/])src([\\/]reconcilers[\\/]tls)$/, `$1dist$1src$2`);
  return join(built, 'challenge-hook.js');
}

/**
 * The hook certbot runs: a script in its work dir that runs the built hook with this Node.
 * certbot checks a hook's first word against PATH without shell quoting, so the command is a
 * bare path, and a path with anything the shell would split or expand is refused.
 */
async function writeHookScript(workDir: string): Promise<string> {
  const script = join(workDir, 'dstack-proxy-challenge-hook');
  for (const p of [script, process.execPath, challengeHookPath()]) {
    if (!/^[A-Za-z0-9_./+@:-]+$/.test(p))
      throw new Error(`cannot run certbot's HTTP-01 hook from ${JSON.stringify(p)}: a path with spaces or shell characters`);
  }
  await writeFile(script, `#!/bin/sh\nexec ${process.execPath} ${challengeHookPath()} "$@"\n`, { mode: 0o700 });
  return script;
}

/** Runs certbot requests one at a time. Long-lived: it holds the queue. */
export class CertbotRunner {
  readonly #bin: string;
  readonly #timeoutMs: number;
  readonly #env: Record<string, string>;
  #tail: Promise<unknown> = Promise.resolve();
  runs = 0;

  constructor(o: CertbotRunnerOptions = {}) {
    this.#bin = o.certbotBin ?? 'certbot';
    this.#timeoutMs = o.timeoutMs ?? DEFAULT_CERTBOT_TIMEOUT_MS;
    this.#env = o.env ?? {};
    if (!Number.isFinite(this.#timeoutMs) || this.#timeoutMs <= 0) throw new RangeError('certbot timeoutMs must be > 0');
  }

  /** Runs `req` after the runs queued before it; its timeout counts on `clock` from its start. */
  run(req: CertbotRequest, clock: Clock = systemClock): Promise<CertbotResult> {
    const next = this.#tail.then(() => this.#runNow(req, clock));
    this.#tail = next.catch(() => undefined);
    return next;
  }

  async #runNow(req: CertbotRequest, clock: Clock): Promise<CertbotResult> {
    this.runs++;
    const { dirs } = req;
    for (const d of [dirs.configDir, dirs.workDir, dirs.logsDir]) await mkdir(d, { recursive: true, mode: 0o700 });
    await mkdir(req.webroot, { recursive: true });
    let configFile: string | null = null;
    if (req.acme.eab) {
      configFile = join(dirs.workDir, `eab-${process.pid}-${this.runs}.ini`);
      const ini = `eab-kid = ${req.acme.eab.kid}\neab-hmac-key = ${req.acme.eab.hmacKey.reveal()}\n`;
      await writeFile(configFile, ini, { mode: 0o600 });
    }
    const secrets = req.acme.eab ? [req.acme.eab.hmacKey.reveal()] : [];
    // The hooks' environment names the fleet's database, password included: never in an error.
    for (const value of Object.values(req.sharedChallenges?.env ?? {})) secrets.push(value, ...urlPassword(value));
    // How long certbot took is measured on the wall clock; only its timeout runs on `clock`.
    const t0 = Date.now();
    try {
      const hookScript = req.sharedChallenges ? await writeHookScript(dirs.workDir) : null;
      const child = execa(this.#bin, certbotArgs(req, configFile, hookScript), {
        detached: true, // own session and process group: the timeout kills all of it
        reject: false,
        stdin: 'ignore',
        all: true,
        env: req.sharedChallenges ? { ...this.#env, ...req.sharedChallenges.env, DSTACK_PROXY_ACME_WEBROOT: req.webroot } : this.#env,
        extendEnv: true,
      });
      let timedOut = false;
      const pid = child.pid;
      let grace: unknown = undefined;
      const timer = clock.setTimeout(() => {
        timedOut = true;
        killGroup(pid, 'SIGTERM');
        grace = clock.setTimeout(() => killGroup(pid, 'SIGKILL'), KILL_GRACE_MS);
      }, this.#timeoutMs);
      const result = await child;
      clock.clearTimeout(timer);
      clock.clearTimeout(grace);
      // Whatever certbot started and left behind goes with it.
      killGroup(pid, 'SIGKILL');
      const durationMs = Date.now() - t0;
      if (timedOut)
        return {
          ok: false,
          durationMs,
          timedOut,
          error: `certbot did not finish within ${Math.round(this.#timeoutMs / 1000)} s and was killed`,
        };
      if (result.exitCode === 0) return { ok: true, durationMs };
      const out = typeof result.all === 'string' ? result.all : '';
      const why = result.exitCode === undefined ? (result.shortMessage ?? 'certbot failed to start') : `exit code ${result.exitCode}`;
      return { ok: false, durationMs, timedOut, error: scrub(errorLine(out) || `certbot failed (${why})`, secrets) };
    } finally {
      if (configFile) await rm(configFile, { force: true });
    }
  }
}

/**
 * Remove the EAB config files (they hold the HMAC key) that a crash during a certbot run left
 * in its work dir: the state file is the only place that key may persist. Call it at start,
 * before any run (the names are the ones #runNow writes).
 */
export async function removeEabLeftovers(workDir: string): Promise<string[]> {
  const names = await readdir(workDir).catch(() => [] as string[]);
  const stale = names.filter((n) => /^eab-\d+-\d+\.ini$/.test(n)).map((n) => join(workDir, n));
  for (const path of stale) await rm(path, { force: true });
  return stale;
}

function killGroup(pid: number | undefined, signal: NodeJS.Signals): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, signal);
  } catch {
    // ESRCH: the group is gone already.
  }
}

const NOISE = [/^Saving debug log to /, /^Ask for help or search/, /^See the logfile /, /^- - - /, /^If you like Certbot/, /^ \* Donating/];

/** certbot's own error, in one readable line (no stack trace, no boilerplate), at most 300 chars. */
export function errorLine(output: string): string {
  const lines = output
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !NOISE.some((re) => re.test(l)) && !/^(Traceback|File ")/.test(l));
  const line = lines.join(' ').replace(/\s+/g, ' ').trim();
  return line.length > 300 ? `${line.slice(0, 297)}...` : line;
}

/** The password of a URL that has one, as written and decoded. */
function urlPassword(value: string): string[] {
  try {
    const p = new URL(value).password;
    return p ? [p, decodeURIComponent(p)] : [];
  } catch {
    return [];
  }
}

/** Replaces every secret (and its base64url/base64 variants are the same string) with <redacted>. */
export function scrub(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) if (s.length > 0) out = out.split(s).join('<redacted>');
  return out;
}
