import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { UPDATE_SUCCESS_LINE, readActive, slotPackageJson, type Slot, type SlotInfo } from '../../src/host/layout.js';
import { decideRollback, decideUpdate, lockFile, takeLock, withLock, type HostActions, type Outcome } from '../../src/host/update.js';
import { validate } from '../../src/spec/index.js';
import { openFileStore } from '../../src/state/file-store.js';
import { runCli } from '../helpers/cli.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir();
afterAll(() => t.cleanup());

let counter = 0;
function freshRoot(): string {
  const root = join(t.dir, `root-${++counter}`);
  mkdirSync(root, { recursive: true });
  return root;
}

function putSlot(root: string, slot: Slot, version: string): void {
  const file = slotPackageJson(root, slot);
  mkdirSync(join(file, '..'), { recursive: true });
  writeFileSync(file, JSON.stringify({ name: 'dstack-proxy', version }));
}

/** A host with `active` holding `version`, and scripted actions that record what was done. */
function scripted(
  root: string,
  script: { installs?: string; install?: Error; check?: Outcome; ready?: Outcome[] },
): { actions: HostActions; done: string[] } {
  const done: string[] = [];
  const ready = [...(script.ready ?? [])];
  const actions: HostActions = {
    install(slot, spec, from) {
      done.push(`install ${spec} into ${slot} from ${from}`);
      if (script.install) return Promise.reject(script.install);
      putSlot(root, slot, script.installs ?? '9.9.9');
      const info: SlotInfo = { slot, version: script.installs ?? '9.9.9', package: spec, runtime: '20.0.0', installedAt: '' };
      return Promise.resolve(info);
    },
    check(slot) {
      done.push(`check ${slot}`);
      return Promise.resolve(script.check ?? { ok: true });
    },
    activate(slot) {
      done.push(`activate ${slot}`);
      writeFileSync(join(root, 'version'), `${slot}\n`);
      return Promise.resolve();
    },
    restartAndWait() {
      done.push('restart');
      return Promise.resolve(ready.shift() ?? { ok: true });
    },
  };
  return { actions, done };
}

function reporter(): { out: string[]; err: string[]; report: { out(l: string): void; err(l: string): void } } {
  const out: string[] = [];
  const err: string[] = [];
  return { out, err, report: { out: (l) => out.push(l), err: (l) => err.push(l) } };
}

function host(active: Slot, version: string): string {
  const root = freshRoot();
  writeFileSync(join(root, 'version'), `${active}\n`);
  putSlot(root, active, version);
  return root;
}

describe('update: the decisions', () => {
  it('skips when the active slot already has the version, and touches nothing', async () => {
    const root = host('blue', '0.1.0');
    const { actions, done } = scripted(root, {});
    const r = reporter();
    expect(await decideUpdate(root, 'dstack-proxy@0.1.0', '0.1.0', actions, r.report)).toBe(0);
    expect(r.out).toEqual(['dstack-proxy 0.1.0 is already installed in blue. Skipping...']);
    expect(done).toEqual([]);
  });

  it('always reinstalls an unversioned build, and reports success only when ready', async () => {
    const root = host('blue', '0.1.0');
    const { actions, done } = scripted(root, { installs: '0.1.0' });
    const r = reporter();
    expect(await decideUpdate(root, '/tmp/x.tgz', '', actions, r.report)).toBe(0);
    expect(done).toEqual(['install /tmp/x.tgz into green from blue', 'check green', 'activate green', 'restart']);
    expect(r.out).toEqual(['dstack-proxy 0.1.0 is running in green (previous: blue 0.1.0)', UPDATE_SUCCESS_LINE]);
    expect(await readActive(root)).toBe('green');
  });

  it('refuses a package of another version than asked, before switching', async () => {
    const root = host('green', '0.1.0');
    const { actions, done } = scripted(root, { installs: '0.1.2' });
    const r = reporter();
    expect(await decideUpdate(root, 'x.tgz', '0.1.1', actions, r.report)).toBe(1);
    expect(r.err).toEqual(['update to 0.1.1 refused before switching: the package from x.tgz is version 0.1.2, not 0.1.1']);
    expect(done).toEqual(['install x.tgz into blue from green']);
    expect(await readActive(root)).toBe('green');
    expect(r.out).not.toContain(UPDATE_SUCCESS_LINE);
  });

  it('refuses when the install or the check fails, without switching or restarting', async () => {
    const root = host('blue', '0.1.0');
    const failedInstall = scripted(root, { install: new Error('npm install x failed (exit 1):\nE404 not found') });
    const r1 = reporter();
    expect(await decideUpdate(root, 'x', '0.2.0', failedInstall.actions, r1.report)).toBe(1);
    expect(r1.err).toEqual(['update to 0.2.0 refused before switching: npm install x failed (exit 1): E404 not found']);
    expect(failedInstall.done).toEqual(['install x into green from blue']);

    const failedCheck = scripted(root, { installs: '0.2.0', check: { ok: false, reason: 'state.json is corrupt' } });
    const r2 = reporter();
    expect(await decideUpdate(root, 'x', '0.2.0', failedCheck.actions, r2.report)).toBe(1);
    expect(r2.err).toEqual(['update to 0.2.0 refused before switching: state.json is corrupt']);
    expect(failedCheck.done).toEqual(['install x into green from blue', 'check green']);
    expect(await readActive(root)).toBe('blue');
  });

  it('rolls back when the new slot is not ready: exit 3, one line, the old slot active', async () => {
    const root = host('blue', '0.1.0');
    const { actions, done } = scripted(root, {
      installs: '0.2.0',
      ready: [{ ok: false, reason: 'not ready within 10 s: ECONNREFUSED' }, { ok: true }],
    });
    const r = reporter();
    expect(await decideUpdate(root, 'x', '0.2.0', actions, r.report)).toBe(3);
    expect(done).toEqual(['install x into green from blue', 'check green', 'activate green', 'restart', 'activate blue', 'restart']);
    expect(r.err).toEqual(['update to 0.2.0 failed: not ready within 10 s: ECONNREFUSED; rolled back to blue (0.1.0)']);
    expect(r.out).toEqual([]);
    expect(await readActive(root)).toBe('blue');
  });

  it('exit 4 when the rollback is not ready either', async () => {
    const root = host('blue', '0.1.0');
    const { actions } = scripted(root, {
      installs: '0.2.0',
      ready: [
        { ok: false, reason: 'a' },
        { ok: false, reason: 'b' },
      ],
    });
    const r = reporter();
    expect(await decideUpdate(root, 'x', '0.2.0', actions, r.report)).toBe(4);
    expect(r.err).toEqual(['update to 0.2.0 failed: a; rolling back to blue (0.1.0) did not make it ready either: b']);
    expect(r.out).toEqual([]);
  });

  it('refuses on a host with no active slot', async () => {
    const root = freshRoot();
    const { actions, done } = scripted(root, {});
    const r = reporter();
    expect(await decideUpdate(root, 'x', '', actions, r.report)).toBe(1);
    expect(r.err[0]).toMatch(/has no active slot/);
    expect(done).toEqual([]);
  });
});

describe('rollback: the decisions', () => {
  it('has nothing to roll back to when the other slot is empty', async () => {
    const root = host('blue', '0.1.0');
    const { actions, done } = scripted(root, {});
    const r = reporter();
    expect(await decideRollback(root, actions, r.report)).toBe(1);
    expect(r.err).toEqual(['nothing to roll back to: green holds no installed package']);
    expect(done).toEqual([]);
  });

  it('switches to the other slot, and back when it is not ready', async () => {
    const root = host('blue', '0.2.0');
    putSlot(root, 'green', '0.1.0');
    const ok = scripted(root, {});
    const r1 = reporter();
    expect(await decideRollback(root, ok.actions, r1.report)).toBe(0);
    expect(r1.out).toEqual(['rolled back to green (0.1.0)']);
    expect(await readActive(root)).toBe('green');

    const bad = scripted(root, { ready: [{ ok: false, reason: 'refused' }, { ok: true }] });
    const r2 = reporter();
    expect(await decideRollback(root, bad.actions, r2.report)).toBe(3);
    expect(r2.err).toEqual(['rollback to blue (0.2.0) failed: refused; switched back to green (0.1.0)']);
    expect(bad.done).toEqual(['activate blue', 'restart', 'activate green', 'restart']);
    expect(await readActive(root)).toBe('green');
  });
});

describe('the update lock', () => {
  it('refuses while a live process holds it, and takes over a dead one', async () => {
    const root = freshRoot();
    const sleeper = spawn('sleep', ['60'], { stdio: 'ignore' });
    try {
      writeFileSync(lockFile(root), `${sleeper.pid}\n`);
      const r = reporter();
      let ran = false;
      expect(
        await withLock(root, r.report, () => {
          ran = true;
          return Promise.resolve(0);
        }),
      ).toBe(1);
      expect(ran).toBe(false);
      expect(r.err).toEqual([`another update (pid ${sleeper.pid}) is running`]);
    } finally {
      sleeper.kill('SIGKILL');
      await new Promise((res) => sleeper.once('exit', res));
    }
    // The holder is gone now: its lock is taken over, ours holds our pid and is released after.
    const lock = takeLock(root);
    expect('release' in lock).toBe(true);
    expect(readFileSync(lockFile(root), 'utf8').trim()).toBe(String(process.pid));
    if ('release' in lock) lock.release();
    expect(() => readFileSync(lockFile(root))).toThrow();
  });
});

describe('gateway --check', () => {
  it('validates the options and the stored state, starting nothing', async () => {
    const dir = freshRoot();
    const stateDir = join(dir, 'state');
    writeFileSync(join(dir, 'config.yaml'), `stateDir: ${stateDir}\napiPort: 1\n`);
    // No state yet: generation 0, and the state dir is not created.
    const empty = await runCli(['gateway', '--config', join(dir, 'config.yaml'), '--check']);
    expect(empty).toMatchObject({ code: 0, stdout: 'config and state are valid (generation 0)\n' });
    expect(() => readFileSync(stateDir)).toThrow();

    // Written by the store itself, twice: generation 2.
    const store = await openFileStore({ stateDir });
    for (const name of ['main', 'other']) {
      const result = validate({ apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec: { projects: [{ name }] } });
      if (!result.ok) throw new Error('the test document is invalid');
      await store.write(result.state);
    }
    await store.close();
    const stored = await runCli(['gateway', '--config', join(dir, 'config.yaml'), '--check']);
    expect(stored).toMatchObject({ code: 0, stdout: 'config and state are valid (generation 2)\n' });
  });

  it('exits 1 with the reason for a corrupt state or a bad option', async () => {
    const dir = freshRoot();
    const stateDir = join(dir, 'state');
    mkdirSync(stateDir);
    writeFileSync(join(stateDir, 'state.json'), '{"apiVersion": ');
    writeFileSync(join(dir, 'config.yaml'), `stateDir: ${stateDir}\n`);
    const corrupt = await runCli(['gateway', '--config', join(dir, 'config.yaml'), '--check']);
    expect(corrupt.code).toBe(1);
    expect(corrupt.stderr).toMatch(/state\.json is corrupt/);

    writeFileSync(join(dir, 'bad.yaml'), `stateDir: ${stateDir}\nhttpPort: 99999\n`);
    const bad = await runCli(['gateway', '--config', join(dir, 'bad.yaml'), '--check']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/httpPort|http-port/);
  });
});
