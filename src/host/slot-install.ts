// Installing a package into a slot: the host's own npm (the pinned one under <root>/runtime,
// never a system npm the host may not have) run by the active slot's node, into the slot as an
// npm prefix; then the runtime the NEW package pins, which its own install script fetches and
// verifies; then the slot's `node` link and slot.json. The slot is replaced as a whole, so what
// is in it afterwards is exactly what this install put there.

import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, realpath, rename, rm, symlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { execa } from 'execa';
import { writeAtomic } from '../write-atomic.js';
import { hostPaths, readSlot, slotDir, slotPackageJson, type Slot, type SlotInfo, type SlotRecord } from './layout.js';

/** The install script shipped in a slot's package (`host/dstack-proxy-install`). */
export function slotInstallScript(root: string, slot: Slot): string {
  return join(dirname(slotPackageJson(root, slot)), 'host', 'dstack-proxy-install');
}

/** The pins at the top of an install script: NODE_VERSION, NPM_VERSION, …; {} when it is absent. */
export async function readScriptPins(file: string): Promise<Record<string, string>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw err;
  }
  const pins: Record<string, string> = {};
  for (const m of text.matchAll(/^(NODE_[A-Za-z0-9_]+|NPM_[A-Z_]+)='?([^'\n]*)'?$/gm)) pins[m[1]!] = m[2]!;
  return pins;
}

function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.-]/).map((p) => Number.parseInt(p, 10) || 0);
  const pb = b.split(/[.-]/).map((p) => Number.parseInt(p, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/**
 * The npm to install with: `<runtime>/npm-<preferred>/bin/npm-cli.js` when present (the one the
 * running package pins), else the newest npm under the runtime dir.
 */
export async function pickNpm(root: string, preferred?: string): Promise<string> {
  const runtimeDir = hostPaths(root).runtimeDir;
  const cli = (v: string): string => join(runtimeDir, `npm-${v}`, 'bin', 'npm-cli.js');
  if (preferred && existsSync(cli(preferred))) return cli(preferred);
  let names: string[] = [];
  try {
    names = await readdir(runtimeDir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const versions = names
    .filter((n) => n.startsWith('npm-'))
    .map((n) => n.slice(4))
    .filter((v) => existsSync(cli(v)))
    .sort(compareVersions);
  const newest = versions.at(-1);
  if (!newest) throw new Error(`no npm under ${runtimeDir} (expected npm-<version>/bin/npm-cli.js)`);
  return cli(newest);
}

/** The last lines of a command's output, for an error that says what went wrong. */
function tail(text: string, lines = 15): string {
  return text.trim().split('\n').slice(-lines).join('\n');
}

/** A spec naming a file here is made absolute: npm resolves a relative one against the prefix, not our cwd. */
function absoluteSpec(spec: string): string {
  if (/^(\.{0,2}\/|~)/.test(spec) || (spec.endsWith('.tgz') && !/^[a-z]+:/i.test(spec))) {
    const file = resolve(spec);
    if (existsSync(file)) return file;
  }
  return spec;
}

export interface SlotInstallOptions {
  root: string;
  /** The slot to (re)create. */
  slot: Slot;
  /** What to install: `dstack-proxy@0.2.0`, a tarball path or URL. */
  spec: string;
  /** The node binary npm runs on: the active slot's. */
  node: string;
  /** The npm version to prefer (the one the active package's install script pins). */
  npmVersion?: string;
  /** Where the runtime packages come from (host.json's runtimeFrom). */
  runtimeFrom?: string;
  /** Progress lines (what is being done, never npm's own chatter). */
  log?: (line: string) => void;
  /** Upper bound for npm's install. */
  timeoutMs?: number;
}

async function installInto(
  stage: string,
  o: SlotInstallOptions,
  nodeReal: string,
  runtimeBin: string,
  runtimeHome: string,
  npm: string,
  log: (line: string) => void,
): Promise<void> {
  const spec = absoluteSpec(o.spec);
  log(`installing ${o.spec} into ${slotDir(o.root, o.slot)}`);
  const install = await execa(
    nodeReal,
    [npm, 'install', '--prefix', stage, '--omit=dev', '--omit=optional', '--no-audit', '--no-fund', '--no-save', '--no-package-lock', spec],
    {
      reject: false,
      all: true,
      stdin: 'ignore',
      timeout: o.timeoutMs ?? 600_000,
      cwd: stage,
      env: {
        PATH: `${runtimeBin}:${process.env.PATH ?? '/usr/bin:/bin'}`,
        npm_config_nodedir: runtimeHome,
        npm_config_update_notifier: 'false',
      },
    },
  );
  if (install.exitCode !== 0) {
    throw new Error(
      `npm install ${o.spec} failed (${install.timedOut ? 'timed out' : `exit ${install.exitCode}`}): ${tail(String(install.all ?? ''))}`,
    );
  }
  if (!existsSync(join(stage, 'node_modules', 'dstack-proxy', 'package.json'))) {
    throw new Error(`npm install ${o.spec} installed no dstack-proxy package`);
  }

  // The runtime the new package pins: its own script fetches and verifies it (a no-op when present).
  const script = join(stage, 'node_modules', 'dstack-proxy', 'host', 'dstack-proxy-install');
  const runtime = await execa('sh', [script, 'runtime', '--root', o.root, ...(o.runtimeFrom ? ['--runtime-from', o.runtimeFrom] : [])], {
    reject: false,
    stdin: 'ignore',
    timeout: o.timeoutMs ?? 600_000,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
  });
  const lastLine =
    String(runtime.stdout ?? '')
      .trim()
      .split('\n')
      .at(-1) ?? '';
  const pinned = /^node-(\d+\.\d+\.\d+)$/.exec(lastLine.trim());
  if (runtime.exitCode !== 0 || !pinned) {
    throw new Error(
      `${script} runtime failed (exit ${runtime.exitCode}${pinned ? '' : `, last line ${JSON.stringify(lastLine.slice(0, 80))}`}): ${tail(String(runtime.stderr ?? ''))}`,
    );
  }
  const version = pinned[1]!;
  await symlink(join('..', 'runtime', `node-${version}`, 'bin', 'node'), join(stage, 'node'));
  if (!existsSync(join(stage, 'node'))) throw new Error(`the slot's node would point to no runtime (node-${version} is missing)`);

  const record: SlotRecord = { package: spec, runtime: version, installedAt: new Date().toISOString() };
  await writeAtomic(join(stage, 'slot.json'), `${JSON.stringify(record, null, 2)}\n`, { mode: 0o644 });
}

/** Replaces `slot` by a fresh install of `spec` with its pinned runtime, and returns what is there now. */
export async function installIntoSlot(o: SlotInstallOptions): Promise<SlotInfo> {
  const { root, slot } = o;
  const log = o.log ?? (() => {});
  const dir = slotDir(root, slot);
  const nodeReal = await realpath(o.node);
  // <root>/runtime/node-<v>/bin/node: npm's PATH and the headers dir of that runtime.
  const runtimeBin = dirname(nodeReal);
  const runtimeHome = dirname(runtimeBin);
  const npm = await pickNpm(root, o.npmVersion);

  // Installed into a staging directory beside the slots and renamed over the slot once whole:
  // a failed install never leaves a slot that looks installed (and the old one, the rollback
  // target, stays until then). The `node` link is relative, so it is right under either name.
  const stage = await mkdtemp(join(root, `.tmp-${slot}-`));
  try {
    await chmod(stage, 0o755);
    await installInto(stage, o, nodeReal, runtimeBin, runtimeHome, npm, log);
    await rm(dir, { recursive: true, force: true });
    await rename(stage, dir);
  } finally {
    await rm(stage, { recursive: true, force: true });
  }
  const info = await readSlot(root, slot);
  if (!info) throw new Error(`${dir} holds no installed package after the install`);
  return info;
}
