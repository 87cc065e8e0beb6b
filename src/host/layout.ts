// The gateway host's layout: one root directory holding a pinned Node runtime, two package
// slots (blue and green) of which the `version` file names the active one, the scripts the
// service unit and dstack's server run, the gateway's config and the host's own settings.
//
//   <root>/runtime/node-<v>/     the official Node binary package, verified by integrity hash
//   <root>/runtime/npm-<v>/      npm, the same way, used only to install packages into slots
//   <root>/blue/ <root>/green/   npm prefixes: node_modules/dstack-proxy/…, `node` (a symlink to
//                                the slot's runtime binary) and slot.json (what was installed)
//   <root>/version               `blue` or `green`: the active slot (the name dstack uses)
//   <root>/start                 what the unit runs: the active slot's gateway on config.yaml
//   <root>/update                `update <package-spec> [<version>]` with the active slot's CLI
//   <root>/config.yaml           the gateway's options (never overwritten once written)
//   <root>/host.json             how this host was installed: unit name, systemctl, unit dir
//
// Everything a slot needs is inside it, so switching slots is one write of `version`, and a
// rollback is the same write back.

import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProxyError } from '../errors.js';

export type Slot = 'blue' | 'green';
export const SLOTS: readonly Slot[] = ['blue', 'green'];

export const DEFAULT_ROOT = '/opt/dstack-proxy';
export const DEFAULT_UNIT_NAME = 'dstack-proxy';
/** The unit name dstack's own gateway uses; an adopted host keeps it, so dstack's restarts reach us. */
export const DSTACK_UNIT_NAME = 'dstack.gateway';
/** dstack's server reads this line on stdout as the sign that an update went through. */
export const UPDATE_SUCCESS_LINE = 'Update successfully completed';

export function otherSlot(slot: Slot): Slot {
  return slot === 'blue' ? 'green' : 'blue';
}

export interface HostPaths {
  root: string;
  runtimeDir: string;
  versionFile: string;
  startScript: string;
  updateScript: string;
  configFile: string;
  hostFile: string;
}

export function hostPaths(root: string): HostPaths {
  return {
    root,
    runtimeDir: join(root, 'runtime'),
    versionFile: join(root, 'version'),
    startScript: join(root, 'start'),
    updateScript: join(root, 'update'),
    configFile: join(root, 'config.yaml'),
    hostFile: join(root, 'host.json'),
  };
}

export function slotDir(root: string, slot: Slot): string {
  return join(root, slot);
}
/** The slot's node binary: a symlink into <root>/runtime, so a slot carries its own runtime. */
export function slotNode(root: string, slot: Slot): string {
  return join(root, slot, 'node');
}
export function slotCli(root: string, slot: Slot): string {
  return join(root, slot, 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js');
}
export function slotPackageJson(root: string, slot: Slot): string {
  return join(root, slot, 'node_modules', 'dstack-proxy', 'package.json');
}
export function slotInfoFile(root: string, slot: Slot): string {
  return join(root, slot, 'slot.json');
}

/** What slot.json records about a slot's install. */
export interface SlotRecord {
  /** The package spec it was installed from: `dstack-proxy@0.2.0`, a tarball path or URL. */
  package: string;
  /** Node version of the runtime its `node` points to, e.g. `20.20.2`. */
  runtime: string;
  /** ISO time of the install. */
  installedAt: string;
}

export interface SlotInfo extends SlotRecord {
  slot: Slot;
  /** The installed package's own version (its package.json), the one `update` compares. */
  version: string;
}

/** How the host was installed (host.json): what update, rollback and status need to act. */
export interface HostSettings {
  /** systemd unit name without `.service`. */
  unitName: string;
  /** Directory the unit file is written to (/etc/systemd/system). */
  unitDir: string;
  /** argv prefix for systemctl: `["systemctl"]`, or a daemonless replacement with its flags. */
  systemctl: string[];
  /** Where the runtime packages are downloaded from (an npm registry base URL); absent = the public registry. */
  runtimeFrom?: string;
}

/** The active slot, or undefined on a host with no `version` file yet. */
export async function readActive(root: string): Promise<Slot | undefined> {
  const file = hostPaths(root).versionFile;
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const slot = text.trim();
  if (slot !== 'blue' && slot !== 'green') {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${file} holds ${JSON.stringify(slot.slice(0, 40))}, not blue or green`);
  }
  return slot;
}

/** A slot's install, or undefined when the slot holds no installed package. */
export async function readSlot(root: string, slot: Slot): Promise<SlotInfo | undefined> {
  let pkg: { version?: unknown };
  try {
    pkg = JSON.parse(await readFile(slotPackageJson(root, slot), 'utf8')) as { version?: unknown };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  let record: Partial<SlotRecord> = {};
  try {
    record = JSON.parse(await readFile(slotInfoFile(root, slot), 'utf8')) as Partial<SlotRecord>;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  return {
    slot,
    version: typeof pkg.version === 'string' ? pkg.version : '',
    package: typeof record.package === 'string' ? record.package : '',
    runtime: typeof record.runtime === 'string' ? record.runtime : '',
    installedAt: typeof record.installedAt === 'string' ? record.installedAt : '',
  };
}

/** host.json: how this host was installed. */
export async function readHostSettings(root: string): Promise<HostSettings> {
  const file = hostPaths(root).hostFile;
  let raw: Partial<HostSettings>;
  try {
    raw = JSON.parse(await readFile(file, 'utf8')) as Partial<HostSettings>;
  } catch (err) {
    throw new Error(`cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message} (is this host installed?)`);
  }
  if (typeof raw.unitName !== 'string' || !Array.isArray(raw.systemctl) || raw.systemctl.some((a) => typeof a !== 'string')) {
    throw new Error(`${file} lacks unitName or systemctl`);
  }
  return raw as HostSettings;
}
