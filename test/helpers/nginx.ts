// A private Nginx for tests: main conf under a tmp dir, free ports on 127.0.0.1, the real
// /usr/sbin/nginx supervised by NginxProcess. Stop it (and remove the dir) with stop().

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  NginxProcess,
  testConfig,
  writeMainConf,
  type MainConfOptions,
  type NginxEvent,
  type NginxPaths,
  type ReloadOutcome,
  type TestResult,
} from '../../src/reconcilers/nginx/nginx-process.js';
import { freePorts } from './ports.js';

export interface TestNginx {
  dir: string;
  paths: NginxPaths;
  httpPort: number;
  httpsPort: number;
  acmeWebroot: string;
  accessLogPath: string;
  proc: NginxProcess;
  events: NginxEvent[];
  test: (confPath: string) => Promise<TestResult>;
  reload: () => Promise<ReloadOutcome>;
  stop: () => Promise<void>;
}

/** Write the main conf; start the process only when `start` is not false. */
export async function startTestNginx(opts: { start?: boolean; main?: MainConfOptions } = {}): Promise<TestNginx> {
  const dir = await mkdtemp(join(tmpdir(), 'dp-nginx-'));
  // Tests of rendering and routing put their backends' sockets and webroots in a 0700 scratch
  // dir, as this user: the workers run as the test's own user here. The gateway's workers and
  // their access to its paths are tested on the gateway (test/e2e/gateway-nginx-worker.test.ts).
  const paths = await writeMainConf(dir, { user: process.getuid?.() === 0 ? 'root' : null, ...opts.main });
  const [httpPort, httpsPort] = (await freePorts(2)) as [number, number];
  const events: NginxEvent[] = [];
  const proc = new NginxProcess({ paths, onEvent: (e) => events.push(e) });
  if (opts.start !== false) await proc.start();
  return {
    dir,
    paths,
    httpPort,
    httpsPort,
    acmeWebroot: join(dir, 'acme'),
    accessLogPath: join(dir, 'logs', 'dstack_stat.log'),
    proc,
    events,
    test: (confPath) => testConfig(confPath, paths.prefix),
    reload: () => proc.reload(),
    stop: async () => {
      await proc.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Poll `check` until it returns a value (not undefined) or the deadline passes. `false` would be
 * a value, and the wait would end at once on a condition not yet met: a check returns `true`
 * or undefined (`cond || undefined`), which the type holds it to.
 */
export async function eventually<T extends object | string | number | true>(
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms${lastErr ? `: ${describeError(lastErr)}` : ''}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** What a thrown value says: an Error's message, a string itself, anything else as JSON. */
function describeError(e: unknown): string {
  if (e instanceof Error) return e.message;
  return typeof e === 'string' ? e : JSON.stringify(e);
}
