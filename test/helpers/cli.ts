import { execFile } from 'node:child_process';
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
