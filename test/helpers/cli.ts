import { execFile, spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';

export const CLI = path.resolve('dist/src/cli.js');

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Run the built CLI (`npm test` builds first) as a user would. */
export function runCli(args: string[], options: { input?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [CLI, ...args],
      { env: { ...process.env, ...options.env }, timeout: options.timeoutMs ?? 30_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
    if (options.input !== undefined) child.stdin?.end(options.input);
    else child.stdin?.end();
  });
}

export interface CliProcess {
  child: ChildProcess;
  /** Everything it printed so far (logs on stdout, the CLI's own lines on stderr). */
  output(): string;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  /** The first match of `re` in the output; rejects when the process exits first or after `timeoutMs`. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
  /** SIGTERM, then SIGKILL after 15 s; the exit code. */
  stop(): Promise<number | null>;
}

/** Start the built CLI as a long-running process (a daemon command), as an operator would. */
export function spawnCli(args: string[], options: { env?: NodeJS.ProcessEnv } = {}): CliProcess {
  const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, ...options.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const changed = new Set<() => void>();
  const onData = (d: Buffer): void => {
    out += d.toString();
    for (const f of changed) f();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const waitFor = (re: RegExp, timeoutMs = 30_000): Promise<RegExpExecArray> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        const m = re.exec(out);
        if (m) done(() => resolve(m));
      };
      const timer = setTimeout(() => done(() => reject(new Error(`no ${re} in the output within ${timeoutMs} ms:\n${out}`))), timeoutMs);
      const done = (f: () => void): void => {
        clearTimeout(timer);
        changed.delete(check);
        f();
      };
      changed.add(check);
      void exited.then((code) => {
        check();
        if (changed.has(check)) done(() => reject(new Error(`exited with ${code} before ${re} appeared:\n${out}`)));
      });
      check();
    });
  const stop = async (): Promise<number | null> => {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    try {
      return await exited;
    } finally {
      clearTimeout(timer);
    }
  };
  return { child, output: () => out, exited, waitFor, stop };
}
