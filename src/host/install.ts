// `host install`: makes a host whose slot already holds the runtime and the package (the
// bootstrap script put them there) run that package as a service, idempotently. Every file is
// rendered, compared with what is on disk and written (atomically) only when it differs, so a
// second run with the same inputs writes nothing, restarts nothing and says so.
//
// What may change what:
//   config.yaml   from --config when given; else an existing one is kept; else a default
//   host.json     the unit name, unit dir, systemctl argv and runtime source of this install
//   slot.json     the slot's package, runtime and install time, when the slot has none yet
//   version       written only when missing: an install never switches an existing host's slot
//   start, update the scripts the unit and dstack's server run
//   the unit      <unit-dir>/<name>.service
// The unit is reloaded when its file changed, started when it is not running, and restarted
// when it runs and the unit, the start script, the config or the active slot's package changed.

import { chmod, readFile, stat } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { basename, join } from 'node:path';
import { ProxyError } from '../errors.js';
import { writeAtomic } from '../write-atomic.js';
import type { GatewayOptions } from '../gateway/options.js';
import { readGatewayConfig, readyUrl } from './gateway-config.js';
import { hostPaths, readActive, readSlot, slotCli, slotInfoFile, slotNode, type HostSettings, type Slot } from './layout.js';
import { ensureNginxConf } from './nginx-conf.js';
import { waitReady } from './readiness.js';
import {
  checkPath,
  checkUnitName,
  renderDefaultConfig,
  renderHostSettings,
  renderSlotRecord,
  renderStartScript,
  renderUnit,
  renderUpdateScript,
  stopTimeout,
} from './render.js';
import { systemctl, unitFile } from './systemctl.js';

export type FileOutcome = 'created' | 'updated' | 'unchanged';

export interface InstallOptions {
  root: string;
  slot: Slot;
  /** The package spec the slot was installed from (recorded in slot.json). */
  package: string;
  /** The Node version of the slot's runtime (recorded in slot.json). */
  runtime: string;
  runtimeFrom?: string;
  /** A config.yaml to install; absent = keep the host's, or write the default. */
  configFile?: string;
  unitName: string;
  unitDir: string;
  systemctl: string[];
  readyTimeoutMs: number;
  /** Progress lines (what changed, what systemctl is asked); default: none. */
  log?: (line: string) => void;
  /** For tests: the time slot.json records. */
  now?: () => Date;
}

export interface InstallReport {
  /** Path → what happened to it. */
  files: Record<string, FileOutcome>;
  /** systemctl verbs run that changed something (daemon-reload, enable, start, restart). */
  actions: string[];
  /** Edits to the system nginx.conf (system mode). */
  nginxEdits: string[];
  /** Nothing was written and nothing started or restarted. */
  nothingToDo: boolean;
  active: Slot;
  version: string;
  url: string;
  unit: string;
}

/** The line an install prints when the gateway is not ready: why, and where its logs are. */
export class NotReadyError extends ProxyError {
  constructor(message: string) {
    super('DP_ERR_NOT_READY', message);
  }
}

/** Seconds since `t` (performance.now()), for the step lines. */
const took = (t: number): string => `${((performance.now() - t) / 1000).toFixed(1)} s`;

export async function installHost(o: InstallOptions): Promise<InstallReport> {
  const log = o.log ?? (() => undefined);
  const started = performance.now();
  const root = checkPath('--root', o.root);
  const unitName = checkUnitName(o.unitName);
  const unitDir = checkPath('--unit-dir', o.unitDir);
  const paths = hostPaths(root);
  const settings: HostSettings = { unitName, unitDir, systemctl: o.systemctl, ...(o.runtimeFrom ? { runtimeFrom: o.runtimeFrom } : {}) };

  // Everything is checked before the first write, so a bad input leaves the host as it was.
  for (const [what, file] of [
    ["the slot's node", slotNode(root, o.slot)],
    ["the slot's package", slotCli(root, o.slot)],
  ] as const) {
    if (!existsSync(file))
      throw new ProxyError('DP_ERR_BAD_OPTION', `${what} ${file} is missing: install the runtime and the package into ${o.slot} first`);
  }
  const hostText = renderHostSettings(settings);
  const startText = renderStartScript(root);
  const updateText = renderUpdateScript(root);
  const configText = await chooseConfig(paths.configFile, o.configFile, root);
  const previousActive = await readActive(root);
  // slot.json describes what the bootstrap (or an update) put into the slot; a rerun of the
  // bootstrap keeps an installed slot as it is, so an existing record stays true and is kept.
  const recordFile = slotInfoFile(root, o.slot);
  const recordText = existsSync(recordFile)
    ? await readFile(recordFile, 'utf8')
    : renderSlotRecord({ package: o.package, runtime: o.runtime, installedAt: (o.now ?? (() => new Date()))().toISOString() });

  const files: Record<string, FileOutcome> = {};
  const put = async (path: string, text: string, mode: number, check?: (temp: string) => void): Promise<FileOutcome> => {
    const outcome = await writeIfChanged(path, text, mode, check);
    files[path] = outcome;
    return outcome;
  };

  // config.yaml first: the text is checked once more as the file the daemon will read.
  const configOutcome = await put(paths.configFile, configText, 0o600, (temp) => void readGatewayConfig(temp));
  const options = readGatewayConfig(paths.configFile);
  await put(paths.hostFile, hostText, 0o600);
  const recordOutcome = await put(recordFile, recordText, 0o644);
  if (previousActive === undefined) await put(paths.versionFile, `${o.slot}\n`, 0o644);
  const active = previousActive ?? o.slot;
  const startOutcome = await put(paths.startScript, startText, 0o755);
  await put(paths.updateScript, updateText, 0o755);
  const unitPath = join(unitDir, unitFile(settings));
  const unitOutcome = await put(unitPath, renderUnit({ root, timeoutStopSec: stopTimeout(options.drainPeriod) }), 0o644);

  const changed = Object.values(files).filter((f) => f !== 'unchanged').length;
  log(`wrote ${changed} of ${Object.keys(files).length} files (${took(started)})`);
  const nginxStarted = performance.now();
  const nginxEdits = options.nginx === 'system' ? await patchSystemNginx(options) : [];
  if (nginxEdits.length > 0) log(`edited the system nginx.conf: ${nginxEdits.join('; ')} (${took(nginxStarted)})`);

  const actions: string[] = [];
  const run = async (args: string[]): Promise<void> => {
    const t = performance.now();
    const r = await systemctl(settings, args);
    if (r.exitCode !== 0) {
      throw new ProxyError('DP_ERR_INTERNAL', `systemctl ${args.join(' ')} exited ${r.exitCode}: ${oneLine(r.stderr || r.stdout)}`);
    }
    log(`systemctl ${args.join(' ')} (${took(t)})`);
    actions.push(args[0]!);
  };
  const unit = unitFile(settings);
  if (unitOutcome !== 'unchanged') await run(['daemon-reload']);
  // enable is idempotent; it is run (and reported) only when the unit's wants link is not there yet.
  if (!existsSync(join(unitDir, 'multi-user.target.wants', unit))) await run(['enable', unit]);
  const running = (await systemctl(settings, ['is-active', unit])).exitCode === 0;
  if (!running) {
    await run(['start', unit]);
  } else if (
    unitOutcome !== 'unchanged' ||
    startOutcome !== 'unchanged' ||
    configOutcome !== 'unchanged' ||
    (recordOutcome === 'created' && active === o.slot)
  ) {
    await run(['restart', unit]);
  }

  const url = readyUrl(options);
  const readyStarted = performance.now();
  const ready = await waitReady(url, o.readyTimeoutMs);
  if (ready.ready) log(`the gateway answered ${url} (${took(readyStarted)})`);
  if (!ready.ready) {
    throw new NotReadyError(
      `${unit} is not ready after ${Math.round(o.readyTimeoutMs / 1000)} s: ${ready.reason}; its logs: ${logHint(settings)}`,
    );
  }
  const info = await readSlot(root, active);
  const nothingToDo = Object.values(files).every((f) => f === 'unchanged') && actions.length === 0 && nginxEdits.length === 0;
  return { files, actions, nginxEdits, nothingToDo, active, version: info?.version ?? '', url, unit };
}

/** The config text to install: --config FILE's, else the host's own, else the default; each checked first. */
async function chooseConfig(target: string, given: string | undefined, root: string): Promise<string> {
  if (given !== undefined) {
    const text = await readFile(given, 'utf8').catch((err: NodeJS.ErrnoException) => {
      throw new ProxyError('DP_ERR_BAD_OPTION', `--config ${given}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`);
    });
    checkConfig(given, given);
    return text;
  }
  if (existsSync(target)) {
    checkConfig(target, target);
    return readFile(target, 'utf8');
  }
  return renderDefaultConfig(root);
}

function checkConfig(file: string, name: string): GatewayOptions {
  try {
    return readGatewayConfig(file);
  } catch (err) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${name} is not a valid gateway config: ${(err as Error).message}`);
  }
}

async function patchSystemNginx(options: GatewayOptions): Promise<string[]> {
  const testCommand = options.testCommand.split(' ').filter(Boolean);
  const outcome = await ensureNginxConf({ nginxConf: options.nginxConf, sitesDir: options.sitesDir!, testCommand });
  return outcome.changed ? outcome.edits : [];
}

/**
 * Writes `text` to `path` (mode `mode`) unless it already holds exactly that: a file whose
 * bytes and mode are right is not touched (its mtime stays). `check` runs on the temp file
 * before it replaces the target; a throw leaves the target as it was.
 */
export async function writeIfChanged(path: string, text: string, mode: number, check?: (temp: string) => void): Promise<FileOutcome> {
  let current: string | undefined;
  let currentMode: number | undefined;
  try {
    current = await readFile(path, 'utf8');
    currentMode = (await stat(path)).mode & 0o7777;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  if (current === text) {
    if (currentMode === mode) return 'unchanged';
    await chmod(path, mode);
    return 'updated';
  }
  await writeAtomic(path, text, {
    mode,
    // A host without systemd may have no unit dir yet.
    makeDir: true,
    dirMode: 0o755,
    fsyncFile: true,
    // The umask must not take bits off a script the unit executes.
    beforeRename: async (temp) => {
      await chmod(temp, mode);
      check?.(temp);
    },
  });
  return current === undefined ? 'created' : 'updated';
}

function oneLine(s: string): string {
  return s.replace(/\s+/g, ' ').trim().slice(0, 300) || 'no output';
}

/**
 * Where the unit's output goes: the journal under systemd; the daemonless replacement
 * (docker-systemctl-replacement, no journald) writes <its root>/var/log/journal/<unit>.log.
 */
export function logHint(settings: Pick<HostSettings, 'unitName' | 'systemctl'>): string {
  const unit = unitFile(settings);
  const [program = 'systemctl', ...rest] = settings.systemctl;
  const script = basename(program) === 'systemctl' ? program : (rest.find((a) => !a.startsWith('-')) ?? program);
  const sysroot = rest.find((a) => a.startsWith('--root='))?.slice('--root='.length);
  const daemonless = sysroot !== undefined || basename(script) === 'systemctl3.py' || !existsSync('/run/systemd/system');
  if (!daemonless) return `journalctl -u ${unit}`;
  return join(sysroot ?? '/', 'var', 'log', 'journal', `${unit}.log`);
}
