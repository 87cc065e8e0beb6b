// Shared by the plan/apply/status tests: a real gateway (private Nginx, free ports on
// 127.0.0.1, tmp state dir) and a captured Io to call a command's run() with.

import { join } from 'node:path';
import { pino } from 'pino';
import type { Io } from '../../src/cli/command.js';
import { startGateway, type Gateway, type GatewayDeps } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

export interface TestGateway {
  gateway: Gateway;
  url: string;
  stop(): Promise<void>;
}

export async function startTestGateway(flags: Record<string, string> = {}, deps: GatewayDeps = {}): Promise<TestGateway> {
  const t = tmpDir('dp-cli-');
  const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
  const options = resolveOptions({
    flags: {
      stateDir: join(t.dir, 'state'),
      apiHost: '127.0.0.1',
      apiPort: String(apiPort),
      listenHost: '127.0.0.1',
      httpPort: String(httpPort),
      httpsPort: String(httpsPort),
      nginx: 'private',
      logLevel: 'silent',
      ...flags,
    },
    env: {},
  });
  const gateway = await startGateway(options, { logger: pino({ level: 'silent' }), ...deps });
  return {
    gateway,
    url: gateway.apiUrl,
    stop: async () => {
      await gateway.close();
      t.cleanup();
    },
  };
}

export interface CapturedIo extends Io {
  out: string[];
  err: string[];
  readonly stdoutText: string;
  readonly stderrText: string;
}

export function captureIo(opts: { isTTY?: boolean; env?: NodeJS.ProcessEnv; stdin?: string } = {}): CapturedIo {
  const out: string[] = [];
  const err: string[] = [];
  return {
    out,
    err,
    stdout: (s) => void out.push(s),
    stderr: (s) => void err.push(s),
    readStdin: async () => opts.stdin ?? '',
    isTTY: opts.isTTY ?? false,
    env: opts.env ?? {},
    get stdoutText() {
      return out.join('');
    },
    get stderrText() {
      return err.join('');
    },
  };
}

/** Matches any ANSI SGR escape. */
export const ANSI = /\u001b\[[0-9;]*m/;
