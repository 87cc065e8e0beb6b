// The built CLI's `server-proxy` as an operator starts it: a child process whose output is kept
// for failure messages, its URLs read from the "listening on" line.

import { spawn, type ChildProcess } from 'node:child_process';
import { CLI } from '../helpers/cli.js';
import { eventually } from '../helpers/nginx.js';

export interface ProxyProcess {
  url: string;
  /** Where its management routes are: `url`, the --api-port listener's, or undefined when they are off. */
  apiUrl: string | undefined;
  child: ChildProcess;
  /** Everything it printed (logs on stdout, the CLI's lines on stderr), for failure messages. */
  output(): string;
  /** Still running (neither exited nor killed by a signal). */
  alive(): boolean;
  stop(): Promise<number | null>;
}

/** `dstack-proxy server-proxy <args>`; resolves once it listens, rejects if it exits first. */
export async function startServerProxyProcess(args: string[]): Promise<ProxyProcess> {
  const child = spawn(process.execPath, [CLI, 'server-proxy', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const alive = (): boolean => child.exitCode === null && child.signalCode === null;
  const stop = async (): Promise<number | null> => {
    if (!alive()) return child.exitCode;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    try {
      return await exited;
    } finally {
      clearTimeout(timer);
    }
  };
  const line = await Promise.race([
    eventually(() => /listening on (http:\/\/[^\s,]+)(, management API (?:on (http:\/\/\S+)|off))?/.exec(out) ?? undefined, 30_000),
    exited.then((code) => Promise.reject(new Error(`server-proxy exited with ${code} before listening:\n${out}`))),
  ]).catch(async (err: unknown) => {
    await stop();
    throw err;
  });
  const url = line[1]!;
  const apiUrl = line[2] === undefined ? url : line[3];
  return { url, apiUrl, child, output: () => out, alive, stop };
}
