// `dstack-proxy gateway` as a process of its own (dist/src/cli.js, as an operator runs it), for
// tests that kill it with SIGKILL. Private Nginx, 127.0.0.1, no periodic pass.

import { spawn, type ChildProcess } from 'node:child_process';
import { CLI } from './cli.js';
import { api } from './gateway.js';
import { eventually } from './nginx.js';

export interface CliGateway {
  child: ChildProcess;
  apiPort: number;
  httpPort: number;
  /** What the process wrote to stderr so far. */
  stderr: () => string;
  /** SIGKILL, and wait for the exit. */
  kill: () => Promise<void>;
}

export interface CliGatewayPorts {
  apiPort: number;
  httpPort: number;
  httpsPort: number;
}

/** Start it; resolves once /readyz answers 200 (the first reconcile pass has finished). */
export async function startCliGateway(
  stateDir: string,
  ports: CliGatewayPorts,
  opts: { readyTimeoutMs?: number; args?: string[]; waitReady?: boolean } = {},
): Promise<CliGateway> {
  const args = ['gateway', '--state-dir', stateDir, '--api-port', String(ports.apiPort), '--http-port', String(ports.httpPort)];
  args.push('--https-port', String(ports.httpsPort), '--listen-host', '127.0.0.1', '--log-level', 'warn', '--resync-interval', '3600');
  args.push(...(opts.args ?? []));
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const gw: CliGateway = {
    child,
    apiPort: ports.apiPort,
    httpPort: ports.httpPort,
    stderr: () => stderr,
    kill: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
  if (opts.waitReady === false) return gw;
  try {
    await eventually(async () => {
      if (child.exitCode !== null) throw new Error(`gateway exited ${child.exitCode}`);
      const r = await api(ports, { path: '/readyz' }).catch(() => null);
      return r?.status === 200 ? true : undefined;
    }, opts.readyTimeoutMs ?? 30_000);
  } catch (err) {
    await gw.kill();
    throw new Error(`${String(err)}\n${stderr.slice(-2000)}`);
  }
  return gw;
}
