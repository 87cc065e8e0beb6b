// A certbot that hangs is killed at the timeout with its whole process group.

import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CertbotRunner } from '../../../src/reconcilers/tls/certbot.js';
import { FakeClock } from '../../helpers/fake-clock.js';
import { Controller } from '../../../src/reconcilers/controller.js';
import { createTlsLoop } from '../../../src/reconcilers/tls/loop.js';
import { emptyState } from '../../../src/spec/types.js';
import { eventually } from '../../helpers/nginx.js';

const dir = mkdtempSync(join(tmpdir(), 'dp-certbot-hang-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** PIDs of live processes in process group `pgid` (from /proc). */
function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[2]) === pgid && fields[0] !== 'Z') out.push(Number(e));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

function hangingCertbot(name: string): { bin: string; pidFile: string } {
  const pidFile = join(dir, `${name}.pid`);
  const bin = join(dir, `${name}.sh`);
  writeFileSync(bin, `#!/bin/sh\necho $$ > ${pidFile}\nsleep 300 &\nsleep 300\n`);
  chmodSync(bin, 0o755);
  return { bin, pidFile };
}

/** certbot's process group once the script has written its pid and started its children. */
async function startedGroup(pidFile: string): Promise<number> {
  return eventually(() => {
    if (!existsSync(pidFile)) return undefined;
    const pgid = Number(readFileSync(pidFile, 'utf8').trim());
    return pgid > 0 && groupMembers(pgid).length >= 2 ? pgid : undefined;
  }, 10_000);
}

describe('certbot timeout', () => {
  it('kills the whole process group at the timeout on its clock, and leaves nothing behind', async () => {
    const { bin, pidFile } = hangingCertbot('runner');
    const clock = new FakeClock(Date.now());
    // A minute: on the wall clock this test would time out; only the run's clock reaches it.
    const runner = new CertbotRunner({ certbotBin: bin, timeoutMs: 60_000 });
    const dirs = { configDir: join(dir, 'c'), workDir: join(dir, 'w'), logsDir: join(dir, 'l') };
    let settled = false;
    const run = runner.run(
      { domain: 'a.gw.test', acme: { server: 'https://127.0.0.1:1/dir' }, webroot: join(dir, 'web'), dirs, force: true },
      clock,
    );
    void run.finally(() => (settled = true));
    const pgid = await startedGroup(pidFile);
    clock.advance(59_999); // not yet
    await new Promise((r) => setTimeout(r, 50));
    expect(settled).toBe(false);
    expect(groupMembers(pgid).length).toBeGreaterThan(0);
    clock.advance(1);
    const r = await run;
    expect(r).toMatchObject({ ok: false, timedOut: true });
    if (!r.ok) expect(r.error).toBe('certbot did not finish within 60 s and was killed');
    await eventually(() => (groupMembers(pgid).length === 0 ? true : undefined), 10_000);
  });

  it('the loop reports the timeout as a failed attempt', async () => {
    const { bin, pidFile } = hangingCertbot('loop');
    const clock = new FakeClock(Date.now());
    const stateDir = join(dir, 'state');
    const loop = createTlsLoop({
      stateDir,
      acmeWebroot: join(dir, 'web'),
      certbotBin: bin,
      timeoutMs: 1_000,
      resolve: async () => ['127.0.0.1'],
    });
    const state = emptyState();
    state.spec.entrypoints.push({ project: 'main', domain: 'hang.gw.test', https: true });
    const controller = new Controller({ loops: [loop as never], getSpec: () => ({ state, generation: 1 }), clock });
    const started = controller.start();
    await startedGroup(pidFile);
    clock.advance(1_000);
    await started;
    await controller.stop();
    const ready = controller.statuses().loops.tls?.objects['hang.gw.test']?.conditions.find((c) => c.type === 'Ready');
    expect(ready).toMatchObject({ status: 'False', reason: 'IssueFailed' });
    expect(ready?.message).toContain('failedAttempts 1');
    expect(ready?.message).toContain('error certbot did not finish within 1 s and was killed');
    const pgid = Number(readFileSync(pidFile, 'utf8').trim());
    await eventually(() => (groupMembers(pgid).length === 0 ? true : undefined), 10_000);
  });
});

describe("certbot's own lock", () => {
  it('a run refused because another certbot holds the directories counts as no attempt, and is tried again shortly', async () => {
    // Another certbot on the same directories: the gateway this one takes over from, mid-order.
    // Here a process holding certbot's lock files, as certbot does (lockf on .certbot.lock).
    const stateDir = join(dir, 'locked');
    const dirs = ['config', 'work', 'logs'].map((d) => join(stateDir, 'certbot', d));
    const holder = spawn(
      'python3',
      [
        '-c',
        'import fcntl,os,sys,time\nfs=[]\nfor d in sys.argv[1:]:\n  os.makedirs(d,exist_ok=True)\n  f=open(os.path.join(d,".certbot.lock"),"w")\n  fcntl.lockf(f,fcntl.LOCK_EX|fcntl.LOCK_NB)\n  fs.append(f)\nprint("held",flush=True)\ntime.sleep(60)',
        ...dirs,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    try {
      await new Promise<void>((resolve) => holder.stdout!.once('data', () => resolve()));
      const loop = createTlsLoop({ stateDir, acmeWebroot: join(stateDir, 'web'), dnsPreflight: false });
      const state = emptyState();
      state.spec.acme = { ...state.spec.acme, server: 'https://127.0.0.1:1/dir' };
      state.spec.entrypoints.push({ project: 'main', domain: 'locked.gw.test', https: true });
      const controller = new Controller({
        loops: [loop as never],
        getSpec: () => ({ state, generation: 1 }),
        clock: new FakeClock(Date.now()),
      });
      await controller.reconcileAll();
      await controller.stop();
      expect(loop.certbotRuns()).toBe(1);
      const conditions = controller.statuses().loops.tls?.objects['locked.gw.test']?.conditions ?? [];
      expect(conditions.find((c) => c.type === 'Ready')).toMatchObject({ status: 'False', reason: 'Pending' });
      expect(conditions.find((c) => c.type === 'Issuing')).toMatchObject({ status: 'True' });
      // Nothing recorded: no failure, and no order spent.
      const backoff = JSON.parse(readFileSync(join(stateDir, 'tls-backoff.json'), 'utf8')) as {
        orders: number[];
        domains: Record<string, unknown>;
      };
      expect(backoff.orders).toEqual([]);
      expect(backoff.domains['locked.gw.test']).toBeUndefined();
    } finally {
      holder.kill('SIGKILL');
    }
  });
});
