// One wrk run (-t1 -c16, --latency) against a loopback URL, parsed.

import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface WrkResult {
  rps: number;
  /** Latency percentiles, ms. */
  p50: number;
  p99: number;
  requests: number;
}

export async function runWrk(url: string, seconds = 5): Promise<WrkResult> {
  const { stdout } = await run('wrk', ['-t1', '-c16', `-d${seconds}s`, '--latency', url], { timeout: 60_000 });
  const ms = (p: string): number => {
    const m = new RegExp(`\\s${p}%\\s+([\\d.]+)(us|ms|s)`).exec(stdout);
    if (!m) return 0;
    const v = Number(m[1]);
    return m[2] === 'us' ? v / 1000 : m[2] === 's' ? v * 1000 : v;
  };
  return {
    rps: Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? 0),
    p50: ms('50'),
    p99: ms('99'),
    requests: Number(/(\d+) requests in/.exec(stdout)?.[1] ?? 0),
  };
}
