// Updating and rolling back a gateway host, blue/green. Unlike a blind swap-and-restart, an
// update proves the new slot before and after the switch:
//   - before: the new package is installed into the unused slot, and its own CLI must read the
//     current config and stored state (`gateway --check`); a refusal leaves the running slot
//     alone, not even restarted;
//   - after: the `version` file names the new slot, the unit reloads (its start script hands
//     over to the new slot's gateway, which serves before the old one stops; a unit without
//     that restarts), and /readyz must answer from the new gateway within a timeout; otherwise
//     the file names the old slot again and the unit reloads (or restarts) on it.
// The success line dstack's server looks for is printed only when the new slot serves.
//
// Exit codes: 0 updated (or already at the version), 1 refused or failed before the switch,
// 3 switched but not ready and rolled back (the old slot serves), 4 not ready after the
// rollback either.

import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import { writeAtomic } from '../write-atomic.js';
import type { GatewayOptions } from '../gateway/options.js';
import { readGatewayConfig, readyUrl } from './gateway-config.js';
import {
  UPDATE_SUCCESS_LINE,
  hostPaths,
  otherSlot,
  readActive,
  readHostSettings,
  readSlot,
  slotCli,
  slotNode,
  type HostSettings,
  type Slot,
  type SlotInfo,
} from './layout.js';
import type { Readiness } from './readiness.js';
import { waitReady } from './readiness.js';
import { installIntoSlot, readScriptPins, slotInstallScript } from './slot-install.js';
import { systemctl, unitFile, unitHandsOver } from './systemctl.js';

export const EXIT_REFUSED = 1;
export const EXIT_ROLLED_BACK = 3;
export const EXIT_ROLLBACK_FAILED = 4;

/** A step's outcome: fine, or the one-line reason it is not. */
export type Outcome = { ok: true } | { ok: false; reason: string };

/** What update and rollback do to the host, apart from the decisions (tests replace them). */
export interface HostActions {
  /** Recreates `slot` with `spec` installed, `from` being the active slot whose tools run the install. */
  install(slot: Slot, spec: string, from: Slot): Promise<SlotInfo>;
  /** The slot's own CLI on the current config and state, without starting anything. */
  check(slot: Slot): Promise<Outcome>;
  /** Makes `slot` the one the unit starts (the `version` file). */
  activate(slot: Slot): Promise<void>;
  /** Reloads (hands over) or restarts the unit, and waits until the new gateway is ready or the timeout passes. */
  restartAndWait(): Promise<Outcome>;
}

export interface Reporter {
  out(line: string): void;
  err(line: string): void;
}

/** One line of a possibly multi-line reason: what fits in dstack's log line and ours. */
export function oneLine(text: string, max = 400): string {
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** An action that threw after the switch is a failed restart too: the rollback must still run. */
function restartAndWait(actions: HostActions): Promise<Outcome> {
  return actions.restartAndWait().catch((err: unknown) => ({ ok: false, reason: (err as Error).message }) as Outcome);
}

function describe(info: SlotInfo): string {
  return `${info.slot} (${info.version || 'unknown version'})`;
}

/**
 * The update's decisions, given the host's actions: skip, install, check, switch, wait, roll back.
 * `version` '' means an unversioned build: it is always installed. `spec` '' (no arguments)
 * keeps the running slot and says so.
 */
export async function decideUpdate(root: string, spec: string, version: string, actions: HostActions, report: Reporter): Promise<number> {
  const active = await readActive(root);
  if (!active) {
    report.err(`update refused: ${hostPaths(root).versionFile} is missing: this host has no active slot (run host install)`);
    return EXIT_REFUSED;
  }
  const current = await readSlot(root, active);
  if (!current) {
    report.err(`update refused: the active slot ${active} holds no installed package`);
    return EXIT_REFUSED;
  }
  if (spec === '') {
    // No package named: what an adopted host's update.sh runs when dstack's server asks it to
    // update dstack's own app (its arguments name dstack's wheel, so they are not passed on).
    // The running slot stays; an operator updates this gateway by naming a package.
    report.out(`dstack-proxy ${current.version || '(unknown version)'} is already installed in ${active}. Skipping...`);
    return 0;
  }
  if (version !== '' && current.version === version) {
    report.out(`dstack-proxy ${version} is already installed in ${active}. Skipping...`);
    return 0;
  }
  const target = otherSlot(active);
  const wanted = version || spec;
  let next: SlotInfo;
  try {
    next = await actions.install(target, spec, active);
  } catch (err) {
    report.err(`update to ${wanted} refused before switching: ${oneLine((err as Error).message)}`);
    return EXIT_REFUSED;
  }
  if (version !== '' && next.version !== version) {
    report.err(`update to ${version} refused before switching: the package from ${spec} is version ${next.version}, not ${version}`);
    return EXIT_REFUSED;
  }
  const label = next.version || wanted;
  const checked = await actions.check(target);
  if (!checked.ok) {
    report.err(`update to ${label} refused before switching: ${oneLine(checked.reason)}`);
    return EXIT_REFUSED;
  }

  await actions.activate(target);
  const ready = await restartAndWait(actions);
  if (ready.ok) {
    report.out(`dstack-proxy ${label} is running in ${target} (previous: ${active} ${current.version || 'unknown version'})`);
    report.out(UPDATE_SUCCESS_LINE);
    return 0;
  }
  await actions.activate(active);
  const back = await restartAndWait(actions);
  if (back.ok) {
    report.err(`update to ${label} failed: ${oneLine(ready.reason)}; rolled back to ${describe(current)}`);
    return EXIT_ROLLED_BACK;
  }
  report.err(
    `update to ${label} failed: ${oneLine(ready.reason)}; rolling back to ${describe(current)} did not make it ready either: ${oneLine(back.reason)}`,
  );
  return EXIT_ROLLBACK_FAILED;
}

/** `host rollback`'s decisions: to the other slot if it holds a package; back again if that is not ready. */
export async function decideRollback(root: string, actions: HostActions, report: Reporter): Promise<number> {
  const active = await readActive(root);
  if (!active) {
    report.err(`nothing to roll back to: ${hostPaths(root).versionFile} is missing`);
    return EXIT_REFUSED;
  }
  const target = otherSlot(active);
  const previous = await readSlot(root, target);
  if (!previous) {
    report.err(`nothing to roll back to: ${target} holds no installed package`);
    return EXIT_REFUSED;
  }
  const current = await readSlot(root, active);
  await actions.activate(target);
  const ready = await restartAndWait(actions);
  if (ready.ok) {
    report.out(`rolled back to ${describe(previous)}`);
    return 0;
  }
  const here = current ? describe(current) : active;
  await actions.activate(active);
  const back = await restartAndWait(actions);
  if (back.ok) {
    report.err(`rollback to ${describe(previous)} failed: ${oneLine(ready.reason)}; switched back to ${here}`);
    return EXIT_ROLLED_BACK;
  }
  report.err(
    `rollback to ${describe(previous)} failed: ${oneLine(ready.reason)}; switching back to ${here} did not make it ready either: ${oneLine(back.reason)}`,
  );
  return EXIT_ROLLBACK_FAILED;
}

export interface RealActionsOptions {
  root: string;
  settings: HostSettings;
  readyTimeoutMs: number;
  log?: (line: string) => void;
}

function seconds(since: number): string {
  return `${((Date.now() - since) / 1000).toFixed(1)} s`;
}

/** The host's real actions: the runtime's npm, the slot's CLI, the version file, systemctl, /readyz. */
export function hostActions(o: RealActionsOptions): HostActions {
  const { root, settings } = o;
  const paths = hostPaths(root);
  const log = o.log ?? (() => {});
  return {
    async install(slot, spec, from) {
      const started = Date.now();
      const pins = await readScriptPins(slotInstallScript(root, from));
      const info = await installIntoSlot({
        root,
        slot,
        spec,
        node: slotNode(root, from),
        npmVersion: pins.NPM_VERSION,
        runtimeFrom: settings.runtimeFrom,
        log: o.log,
      });
      log(`installed dstack-proxy ${info.version} (node ${info.runtime}) into ${slot} in ${seconds(started)}`);
      return info;
    },
    async check(slot) {
      const started = Date.now();
      const r = await execa(slotNode(root, slot), [slotCli(root, slot), 'gateway', '--config', paths.configFile, '--check'], {
        reject: false,
        stdin: 'ignore',
        timeout: 120_000,
        cwd: root,
        // The unit's environment, not ours: DSTACK_PROXY_* of whoever runs the update is not the daemon's.
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
        extendEnv: false,
      });
      if (r.exitCode === 0) {
        log(`checked ${slot}: ${oneLine(String(r.stdout ?? '')) || 'ok'} (${seconds(started)})`);
        return { ok: true };
      }
      const said = String(r.stderr ?? '').trim() || String(r.stdout ?? '').trim();
      return { ok: false, reason: `its gateway --check exited ${r.exitCode ?? 'on a signal'}${said ? `: ${said}` : ''}` };
    },
    async activate(slot) {
      await writeAtomic(paths.versionFile, `${slot}\n`, { mode: 0o644, fsyncFile: true, fsyncDir: true });
    },
    async restartAndWait() {
      // The options as the daemon will read them; a config that no longer parses is a reason too.
      let options: GatewayOptions;
      let url: string;
      try {
        options = readGatewayConfig(paths.configFile);
        url = readyUrl(options);
      } catch (err) {
        return { ok: false, reason: (err as Error).message };
      }
      const started = Date.now();
      // A unit whose start script hands over (systemctl reload) and the system Nginx: the new
      // gateway serves before the old one stops. Otherwise (a private Nginx, a unit an older
      // version installed) the unit restarts.
      const handOver = options.nginx === 'system' && unitHandsOver(settings);
      const verb = handOver ? 'reload' : 'restart';
      const done = await systemctl(settings, [verb, unitFile(settings)]);
      if (done.exitCode !== 0) {
        // A daemon that dies at once fails the restart itself (how quickly depends on the
        // service manager); it says nothing more than its exit, so the log is where to look.
        const said = oneLine(done.stderr || done.stdout);
        return {
          ok: false,
          reason: `systemctl ${verb} ${unitFile(settings)} exited ${done.exitCode}${said ? `: ${said}` : ' (its journal says why)'}`,
        };
      }
      // After a reload the old gateway answers /readyz until the new one has its port: only an
      // answer from a process started since counts.
      const ready: Readiness = await waitReady(url, o.readyTimeoutMs, undefined, handOver ? started : undefined);
      if (ready.ready)
        log(
          `${handOver ? 'handed over to a new gateway of' : 'restarted'} ${unitFile(settings)} on ${await readActive(root)}: ready in ${seconds(started)}`,
        );
      return ready.ready
        ? { ok: true }
        : { ok: false, reason: `not ready within ${Math.round(o.readyTimeoutMs / 1000)} s: ${ready.reason}` };
    },
  };
}

/** `<root>/.update.lock`: one update or rollback at a time. */
export function lockFile(root: string): string {
  return join(root, '.update.lock');
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Takes the lock (O_EXCL, holding our pid), taking over one whose process is gone. Returns the
 * release function, or the pid of the live holder.
 */
export function takeLock(root: string): { release: () => void } | { heldBy: number } {
  const file = lockFile(root);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(file, 'wx', 0o644);
      writeSync(fd, `${process.pid}\n`);
      closeSync(fd);
      return {
        release: () => {
          try {
            if (readFileSync(file, 'utf8').trim() === String(process.pid)) unlinkSync(file);
          } catch {
            // Already gone: nothing to release.
          }
        },
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let pid = Number.NaN;
    try {
      pid = Number.parseInt(readFileSync(file, 'utf8').trim(), 10);
    } catch {
      // Removed between our open and read: try again.
    }
    if (Number.isSafeInteger(pid) && pid > 0 && pid !== process.pid && alive(pid)) return { heldBy: pid };
    // A lock left by a process that died (or that holds no pid): take it over.
    try {
      unlinkSync(file);
    } catch {
      // Someone else removed it first; the next O_EXCL open decides.
    }
  }
  return { heldBy: Number.NaN };
}

/** Runs `body` under the lock; a live holder is exit 1 with one line. */
export async function withLock(root: string, report: Reporter, body: () => Promise<number>): Promise<number> {
  const lock = takeLock(root);
  if ('heldBy' in lock) {
    report.err(`another update (pid ${Number.isNaN(lock.heldBy) ? 'unknown' : lock.heldBy}) is running`);
    return EXIT_REFUSED;
  }
  try {
    return await body();
  } finally {
    lock.release();
  }
}

export interface UpdateOptions {
  root: string;
  spec: string;
  version: string;
  readyTimeoutMs: number;
}

export async function updateHost(o: UpdateOptions, report: Reporter): Promise<number> {
  return withLock(o.root, report, async () => {
    const settings = await readHostSettings(o.root);
    const actions = hostActions({ root: o.root, settings, readyTimeoutMs: o.readyTimeoutMs, log: report.out });
    return decideUpdate(o.root, o.spec, o.version, actions, report);
  });
}

export async function rollbackHost(o: { root: string; readyTimeoutMs: number }, report: Reporter): Promise<number> {
  return withLock(o.root, report, async () => {
    const settings = await readHostSettings(o.root);
    return decideRollback(o.root, hostActions({ root: o.root, settings, readyTimeoutMs: o.readyTimeoutMs, log: report.out }), report);
  });
}
