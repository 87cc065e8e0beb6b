// Taking over a gateway host that dstack provisioned (Ubuntu, the system Nginx, ~/dstack with
// blue and green venvs): dstack's app stops, its Nginx files step aside, our config, nginx.conf
// includes and update script take their place, and our unit runs under dstack's unit name, so
// dstack's server (which restarts `dstack.gateway` and runs `~/dstack/update.sh`) drives us.
//
// Every step checks before it acts, so a second run changes nothing. Nothing is deleted: a file
// adopt takes away is moved under <root>/adopted/<time>/ at its original path, and listed in
// that dir's moved.txt. Certificates stay in the letsencrypt dir (our certbot uses it as is),
// and no state is carried over: dstack's server re-registers everything within seconds.

import { execa } from 'execa';
import {
  appendFile,
  chmod,
  chown,
  copyFile,
  lstat,
  mkdir,
  readFile,
  readdir,
  readlink,
  rename,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { ProxyError } from '../errors.js';
import { checkConfPath, ensureNginxConf, patchNginxConf } from './nginx-conf.js';
import { installHost } from './install.js';
import { DSTACK_UNIT_NAME, hostPaths, readActive, readSlot, type Slot } from './layout.js';
import { systemctl } from './systemctl.js';

export const DEFAULT_DSTACK_HOME = '/home/ubuntu/dstack';
export const DEFAULT_SITES_ENABLED = '/etc/nginx/sites-enabled';
export const DEFAULT_LETSENCRYPT = '/etc/letsencrypt';
export const DEFAULT_ACCESS_LOG = '/var/log/nginx/dstack.access.log';
export const DEFAULT_NGINX_CONF = '/etc/nginx/nginx.conf';
/** Our sites dir on an adopted host: next to sites-enabled, outside of it (its glob is `*`). */
export const ADOPTED_SITES_DIR = '/etc/nginx/dstack-proxy';
/** dstack's tunnel from its server ends here: its app listened on uvicorn's default. */
export const DSTACK_API_PORT = 8000;
/** The first line of the update.sh adopt writes: how a second run knows it is already ours. */
export const UPDATE_SH_MARKER = '# dstack-proxy: this host was adopted';

export interface AdoptOptions {
  /** Our root (DEFAULT_ROOT): config.yaml, the update script, adopted/. */
  root: string;
  dstackHome: string;
  nginxConf: string;
  sitesEnabled: string;
  /** `keep`: Ubuntu's default site keeps answering unknown hosts (a load balancer's health check), we render no default_server. */
  defaultSite: 'keep' | 'remove';
  letsencrypt: string;
  accessLog: string;
  /** Where our sites go (the gateway's sitesDir). */
  sitesDir: string;
  systemctl: string[];
  unitDir: string;
  /** The nginx program for `-t` and `-s reload` (with `-c <nginxConf>`). */
  nginxBin: string;
  /** snap, for certbot's snap renewal timer; absent on the host = nothing to disable. */
  snapBin: string;
  /** Extra config.yaml keys, written only when adopt writes the file. */
  extraConfig: Record<string, string>;
  /** Print the steps, change nothing. */
  dryRun: boolean;
  install: AdoptInstall;
}

/** What the install step installs: the slot holding our package; absent = the active slot and its slot.json. */
export interface AdoptInstall {
  slot?: Slot;
  package?: string;
  runtime?: string;
  runtimeFrom?: string;
  readyTimeoutMs: number;
}

export interface AdoptResult {
  /** Something was changed (or, in a dry run, would be). */
  changed: boolean;
  /** Where this run moved files to, when it moved any. */
  adoptedDir: string | undefined;
  /** Steps not done; non-empty means the host is not fully adopted. */
  missing: string[];
}

/** dstack's files in sites-enabled: its log format, its sites, the legacy router confs. */
export function isDstackSiteFile(name: string): boolean {
  return (
    name === '00-log-format.conf' ||
    /^443-.+\.conf$/.test(name) ||
    /^router-workers\..+\.conf$/.test(name) ||
    /^sglang-workers\..+\.conf$/.test(name)
  );
}

export function updateShText(root: string): string {
  const update = hostPaths(root).updateScript;
  return `#!/bin/sh
${UPDATE_SH_MARKER} by dstack-proxy (\`dstack-proxy host adopt\`); dstack's original is under ${root}/adopted/.
# dstack's server runs this as \`update.sh <its gateway package> <build>\`. Those arguments name
# dstack's own package, so they are ignored: this runs our update with no package, which keeps
# the active slot's package and version (it says so and changes nothing). Updating dstack-proxy
# itself: ${update} <package-spec> [<version>].
set -e
if [ "$(id -u)" -ne 0 ]; then
  exec sudo -n /bin/sh ${update}
fi
exec /bin/sh ${update}
`;
}

/** The config.yaml of an adopted host (keys as the gateway's option table names them). */
export function adoptedConfigText(o: AdoptOptions): string {
  const entries: [string, string | number][] = [
    ['nginx', 'system'],
    ['sitesDir', o.sitesDir],
    ['nginxConf', o.nginxConf],
    ...(o.nginxConf === DEFAULT_NGINX_CONF
      ? []
      : ([
          ['reloadCommand', `${o.nginxBin} -c ${o.nginxConf} -s reload`],
          ['testCommand', `${o.nginxBin} -t -q`],
        ] as [string, string][])),
    ['serverUrl', `unix-dir:${join(o.dstackHome, 'server-connections')}`],
    ['accessLog', o.accessLog],
    ['certbotConfigDir', o.letsencrypt],
    ['dstackCompat', 'true'],
    ['apiHost', '127.0.0.1'],
    ['apiPort', DSTACK_API_PORT],
    ['stateDir', join(o.root, 'state')],
    ...(o.defaultSite === 'keep' ? ([['defaultServer', 'false']] as [string, string][]) : []),
  ];
  const keys = new Set(entries.map(([k]) => k));
  for (const [k, v] of Object.entries(o.extraConfig)) {
    if (keys.has(k))
      entries.splice(
        entries.findIndex(([x]) => x === k),
        1,
        [k, v],
      );
    else entries.push([k, v]);
  }
  const lines = entries.map(([k, v]) => `${k}: ${typeof v === 'number' ? v : JSON.stringify(v)}`);
  return `# written by \`dstack-proxy host adopt\` for a host dstack provisioned; never overwritten by it\n${lines.join('\n')}\n`;
}

async function exists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw e;
  }
}

/** `20261201T204500Z`: sorts by time, no characters a shell or Nginx would mind. */
function stamp(d: Date): string {
  return d
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
}

/** Moves a file (or symlink) across file systems too: a copy, then the original removed. */
async function moveFile(from: string, to: string): Promise<void> {
  await mkdir(dirname(to), { recursive: true, mode: 0o700 });
  try {
    await rename(from, to);
    return;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
  }
  const st = await lstat(from);
  if (st.isSymbolicLink()) await symlink(await readlink(from), to);
  else {
    await copyFile(from, to);
    await chmod(to, st.mode & 0o7777);
  }
  await rm(from);
}

function checkOptions(o: AdoptOptions): void {
  checkConfPath('--root', o.root);
  checkConfPath('--dstack-home', o.dstackHome);
  checkConfPath('--nginx-conf', o.nginxConf);
  checkConfPath('--sites-enabled', o.sitesEnabled);
  checkConfPath('--letsencrypt', o.letsencrypt);
  checkConfPath('--access-log', o.accessLog);
  checkConfPath('sitesDir', o.sitesDir);
  checkConfPath('--unit-dir', o.unitDir);
  if (o.systemctl.length === 0) throw new ProxyError('DP_ERR_BAD_OPTION', '--systemctl is empty');
}

/**
 * Adopts the host, printing each step through `say`. Without an installed slot of ours the
 * unit step cannot run: the host is left with dstack's app stopped and the result names the step.
 */
export async function adoptHost(o: AdoptOptions, say: (line: string) => void): Promise<AdoptResult> {
  checkOptions(o);
  const dry = o.dryRun;
  const prefix = dry ? '(dry run) ' : '';
  const note = (line: string) => say(`${prefix}${line}`);
  let changed = false;
  const missing: string[] = [];
  const adoptedDir = join(o.root, 'adopted', stamp(new Date()));
  let moved = 0;
  /** Moves `path` into adoptedDir at its own path, recording it. */
  const stash = async (path: string, why: string) => {
    changed = true;
    note(`  move ${path} → ${join(adoptedDir, path)} (${why})`);
    if (dry) return;
    await moveFile(path, join(adoptedDir, path));
    await appendFile(join(adoptedDir, 'moved.txt'), `${path}\n`);
    moved++;
  };
  const run = async (argv: string[]) => {
    const [program, ...args] = argv;
    return execa(program!, args, { reject: false, all: true, timeout: 120_000, stdin: 'ignore' });
  };

  // a. Is this dstack's gateway, and is its app still the one running?
  say('a. dstack gateway');
  const versionFile = join(o.dstackHome, 'version');
  let colour: string;
  try {
    colour = (await readFile(versionFile, 'utf8')).trim();
  } catch {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `${o.dstackHome} is not a dstack gateway home: no readable ${versionFile} (see --dstack-home)`,
    );
  }
  if ((colour !== 'blue' && colour !== 'green') || !(await exists(join(o.dstackHome, colour)))) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `${o.dstackHome} is not a dstack gateway home: ${versionFile} names ${JSON.stringify(colour.slice(0, 40))}, not an existing blue or green venv`,
    );
  }
  say(`  ${o.dstackHome}: dstack's app in ${colour}/`);
  const unitPath = join(o.unitDir, `${DSTACK_UNIT_NAME}.service`);
  const unitText = (await exists(unitPath)) ? await readFile(unitPath, 'utf8') : undefined;
  const ours = unitText?.includes(hostPaths(o.root).startScript) ?? false;
  if (unitText === undefined) say(`  no ${unitPath}: dstack's unit is not installed, nothing to stop`);
  else if (ours) say(`  ${unitPath} runs ${hostPaths(o.root).startScript}: already ours`);
  else {
    note(`  systemctl stop ${DSTACK_UNIT_NAME}; systemctl disable ${DSTACK_UNIT_NAME}`);
    if (!dry) {
      const settings = { systemctl: o.systemctl };
      const stop = await systemctl(settings, ['stop', DSTACK_UNIT_NAME]);
      if (stop.exitCode !== 0)
        throw new ProxyError('DP_ERR_BAD_OPTION', `systemctl stop ${DSTACK_UNIT_NAME} failed: ${stop.stderr.trim().slice(-500)}`);
      const disable = await systemctl(settings, ['disable', DSTACK_UNIT_NAME]);
      if (disable.exitCode !== 0)
        throw new ProxyError('DP_ERR_BAD_OPTION', `systemctl disable ${DSTACK_UNIT_NAME} failed: ${disable.stderr.trim().slice(-500)}`);
    }
    await stash(unitPath, "dstack's unit; ours takes its name");
    if (!dry) await systemctl({ systemctl: o.systemctl }, ['daemon-reload']);
  }

  // b. dstack's Nginx files out of sites-enabled.
  say(`b. Nginx sites in ${o.sitesEnabled}`);
  const names = (await exists(o.sitesEnabled)) ? (await readdir(o.sitesEnabled)).sort() : [];
  const theirs = names.filter(isDstackSiteFile);
  for (const name of theirs) await stash(join(o.sitesEnabled, name), "dstack's site; ours are rendered into the sites dir");
  if (theirs.length === 0) say('  no dstack files left in it');
  if (names.includes('default')) {
    if (o.defaultSite === 'remove')
      await stash(join(o.sitesEnabled, 'default'), '--default-site remove: our default server answers unknown hosts');
    else say('  default kept (--default-site keep): it answers unknown hosts, we render no default_server');
  }

  // c. Our config.
  say('c. config');
  const configFile = hostPaths(o.root).configFile;
  if (await exists(configFile)) say(`  ${configFile} exists: kept as it is (never overwritten)`);
  else {
    changed = true;
    const text = adoptedConfigText(o);
    note(`  write ${configFile}:`);
    for (const l of text.trimEnd().split('\n')) say(`    ${l}`);
    if (!dry) {
      await mkdir(o.root, { recursive: true, mode: 0o755 });
      // The config names no secret, but the state dir next to it is private: keep the file to root.
      await writeFile(configFile, text, { mode: 0o600, flag: 'wx' });
    }
  }

  // d. nginx.conf: our includes and limits, tested; then the running Nginx reloads.
  say(`d. ${o.nginxConf}`);
  const testCommand = [o.nginxBin, '-t', '-q'];
  if (dry) {
    const patch = patchNginxConf(await readFile(o.nginxConf, 'utf8'), o.sitesDir);
    if (patch.changed) changed = true;
    for (const e of patch.edits) note(`  ${e}`);
    if (!patch.changed) say('  already has our includes and limits');
  } else {
    const patch = await ensureNginxConf({ nginxConf: o.nginxConf, sitesDir: o.sitesDir, testCommand });
    if (patch.changed) {
      changed = true;
      for (const e of patch.edits) say(`  ${e}`);
      say(`  the original is kept as ${o.nginxConf}.dstack-proxy.bak`);
    } else say('  already has our includes and limits');
  }
  if (!dry) {
    const t = await run([...testCommand, '-c', o.nginxConf]);
    if (t.exitCode !== 0)
      throw new ProxyError(
        'DP_ERR_BAD_OPTION',
        `nginx -t -c ${o.nginxConf} fails, not reloading:\n${String(t.all ?? '')
          .trim()
          .slice(-2000)}`,
      );
    say('  nginx -t: ok');
    if (changed) {
      const r = await run([o.nginxBin, '-c', o.nginxConf, '-s', 'reload']);
      if (r.exitCode === 0) say('  nginx reloaded');
      else
        say(
          `  nginx reload failed (our gateway reloads it when it starts): ${String(r.all ?? '')
            .trim()
            .slice(-300)}`,
        );
    }
  }

  // e. update.sh: dstack's server runs it on every start; ours must not reinstall dstack's app.
  say(`e. ${join(o.dstackHome, 'update.sh')}`);
  const updateSh = join(o.dstackHome, 'update.sh');
  const wanted = updateShText(o.root);
  const current = (await exists(updateSh)) ? await readFile(updateSh, 'utf8') : undefined;
  if (current === wanted) say('  already ours');
  else {
    const owner = await stat(current === undefined ? o.dstackHome : updateSh);
    if (current !== undefined && !current.includes(UPDATE_SH_MARKER)) await stash(updateSh, "dstack's update script");
    changed = true;
    note(`  write ${updateSh}: runs ${hostPaths(o.root).updateScript} (dstack's arguments ignored)`);
    if (!dry) {
      await writeFile(`${updateSh}.new`, wanted, { mode: 0o755 });
      if (process.getuid?.() === 0) await chown(`${updateSh}.new`, owner.uid, owner.gid);
      await rename(`${updateSh}.new`, updateSh);
    }
  }
  say(`  ${join(o.dstackHome, 'start.sh')} left as it is (the unit that ran it is disabled)`);

  // f. Our unit, under dstack's name: the install step, on the slot the package is in.
  say(`f. unit ${DSTACK_UNIT_NAME}`);
  const slot = o.install.slot ?? (await readActive(o.root));
  const info = slot ? await readSlot(o.root, slot) : undefined;
  const pkg = o.install.package ?? info?.package;
  const runtime = o.install.runtime ?? info?.runtime;
  if (!slot || !pkg || !runtime) {
    missing.push(
      `f: our unit ${DSTACK_UNIT_NAME} is not installed: ${o.root} has no installed dstack-proxy slot (install the runtime and the package first, or pass --slot, --package and --runtime)`,
    );
    say(`  NOT DONE: ${missing[missing.length - 1]}`);
  } else if (dry) note(`  install ${slot} (${pkg}, node ${runtime}) as ${DSTACK_UNIT_NAME}, start it, wait for /readyz`);
  else {
    const report = await installHost({
      root: o.root,
      slot,
      package: pkg,
      runtime,
      ...(o.install.runtimeFrom ? { runtimeFrom: o.install.runtimeFrom } : {}),
      unitName: DSTACK_UNIT_NAME,
      unitDir: o.unitDir,
      systemctl: o.systemctl,
      readyTimeoutMs: o.install.readyTimeoutMs,
      log: (l) => say(`  ${l}`),
    });
    if (!report.nothingToDo) changed = true;
    for (const [file, outcome] of Object.entries(report.files)) if (outcome !== 'unchanged') say(`  ${outcome} ${file}`);
    say(`  dstack-proxy ${report.version} (${report.active}) is ready at ${report.url}`);
  }

  // g. Certificates stay; certbot's own renewal timer would race ours.
  say(`g. certificates in ${o.letsencrypt}: kept, served as they are (no ACME request for a valid one)`);
  const snap = await run([o.snapBin, 'services', 'certbot.renew']).catch(() => undefined);
  if (snap && snap.exitCode === 0 && /\benabled\b/.test(String(snap.all ?? ''))) {
    changed = true;
    note('  snap stop --disable certbot.renew (we renew)');
    if (!dry) {
      const r = await run([o.snapBin, 'stop', '--disable', 'certbot.renew']);
      if (r.exitCode !== 0)
        say(
          `  snap stop --disable certbot.renew failed: ${String(r.all ?? '')
            .trim()
            .slice(-300)}`,
        );
    }
  }
  const enabled = await systemctl({ systemctl: o.systemctl }, ['is-enabled', 'certbot.timer']).catch(() => undefined);
  if (enabled && enabled.exitCode === 0 && enabled.stdout.trim() === 'enabled') {
    changed = true;
    note('  systemctl disable --now certbot.timer (we renew)');
    if (!dry) {
      await systemctl({ systemctl: o.systemctl }, ['stop', 'certbot.timer']);
      await systemctl({ systemctl: o.systemctl }, ['disable', 'certbot.timer']);
    }
  }

  // h. State.
  say("h. state: none carried over; dstack's server registers its services and replicas again on its next sync");
  if (moved > 0) say(`moved files are under ${adoptedDir} (listed in moved.txt)`);
  say(changed ? `${prefix}adopted` : 'nothing to change: already adopted');
  return { changed, adoptedDir: moved > 0 ? adoptedDir : undefined, missing };
}
