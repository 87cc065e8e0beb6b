// systemctl as the host was installed with it (host.json): the real one, or a daemonless
// replacement (docker-systemctl-replacement on dstack's Kubernetes gateways). Only the verbs
// both understand are used: daemon-reload, enable, disable, start, stop, restart, reload,
// is-active.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import type { HostSettings } from './layout.js';

export interface SystemctlResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** Runs `<systemctl argv> <args>`; never throws on a non-zero exit (is-active says no that way). */
export async function systemctl(settings: Pick<HostSettings, 'systemctl'>, args: string[], timeoutMs = 120_000): Promise<SystemctlResult> {
  const [program, ...prefix] = settings.systemctl;
  if (!program) throw new Error('host.json names no systemctl program');
  const r = await execa(program, [...prefix, ...args], { reject: false, timeout: timeoutMs, stdin: 'ignore' });
  return {
    exitCode: r.exitCode ?? 1,
    stdout: String(r.stdout ?? ''),
    stderr: String(r.stderr ?? '') || (r.timedOut ? `systemctl ${args.join(' ')} timed out` : ''),
  };
}

export function unitFile(settings: Pick<HostSettings, 'unitName'>): string {
  return `${settings.unitName}.service`;
}

/**
 * Whether the installed unit reloads by handing over to a new gateway (its start script takes
 * SIGHUP for that): units written before it did restart instead.
 */
export function unitHandsOver(settings: Pick<HostSettings, 'unitName' | 'unitDir'>): boolean {
  try {
    return readFileSync(join(settings.unitDir, unitFile(settings)), 'utf8')
      .split('\n')
      .some((l) => l.startsWith('ExecReload='));
  } catch {
    return false;
  }
}
