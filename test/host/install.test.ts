// `host install` for real, as root, in temporary dirs only: the pinned Node runtime (the real
// registry packages, served from loopback), a tarball of this checkout installed into the blue
// slot, the unit started and stopped by Debian's daemonless systemctl replacement on a
// temporary unit tree, the gateway on its private Nginx on loopback ports. One install is
// shared by the cases; a second run must change nothing.

import { mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { INSTALL_SCRIPT, packTarball, runtimePackages, startRuntimeRegistry, systemctlReplacement } from './fixtures.js';

const asRoot = process.getuid?.() === 0;
const UNIT = 'dstack-proxy-test';

interface Run {
  exitCode: number;
  stdout: string;
  stderr: string;
  ms: number;
}

let tmp: { dir: string; cleanup: () => void };
let root: string;
let sysroot: string;
let unitDir: string;
let systemctlArgv: string[];
let registry: Awaited<ReturnType<typeof startRuntimeRegistry>>;
let tarball: string;
let configFile: string;
let ports: { api: number; http: number; https: number };
let first: Run;
let pkgVersion: string;
const runtime = asRoot ? runtimePackages() : undefined;

/** What the script passes through to `host install` unchanged. */
function tailArgs(): string[] {
  return ['--unit-name', UNIT, '--unit-dir', unitDir, '--systemctl', systemctlArgv.join(' '), '--ready-timeout', '90'];
}

function installArgs(): string[] {
  return [
    '--root',
    root,
    '--slot',
    'blue',
    '--package',
    tarball,
    '--runtime',
    runtime!.node.version,
    '--runtime-from',
    registry.url,
    '--config',
    configFile,
    '--unit-name',
    UNIT,
    '--unit-dir',
    unitDir,
    '--systemctl',
    systemctlArgv.join(' '),
    '--ready-timeout',
    '90',
  ];
}

/** The install as a host runs it: the bootstrap script, which hands over to the slot's `host install`. */
async function install(): Promise<Run> {
  const start = Date.now();
  const r = await execa(
    'sh',
    [
      INSTALL_SCRIPT,
      'install',
      '--root',
      root,
      '--skip-packages',
      '--package',
      tarball,
      '--runtime-from',
      registry.url,
      '--config',
      configFile,
      '--',
      ...tailArgs(),
    ],
    { reject: false, stdin: 'ignore', timeout: 300_000 },
  );
  return { exitCode: r.exitCode ?? 1, stdout: String(r.stdout), stderr: String(r.stderr), ms: Date.now() - start };
}

function cliOf(slot: string): string {
  return join(root, slot, 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js');
}

async function hostCli(args: string[]): Promise<Run> {
  const start = Date.now();
  const r = await execa(join(root, 'blue', 'node'), [cliOf('blue'), 'host', ...args], { reject: false, stdin: 'ignore', timeout: 120_000 });
  return { exitCode: r.exitCode ?? 1, stdout: String(r.stdout), stderr: String(r.stderr), ms: Date.now() - start };
}

/** The PID listening on 127.0.0.1:port, from the kernel's socket table. */
async function listener(port: number): Promise<number | undefined> {
  const r = await execa('ss', ['-Htlnp', `sport = :${port}`], { reject: false });
  const m = /pid=(\d+)/.exec(String(r.stdout));
  return m ? Number(m[1]) : undefined;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

async function until<T>(probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T | undefined> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined || Date.now() > end) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The files install writes, with content and mtime. */
function snapshot(): Record<string, { text: string; mtimeMs: number; mode: number }> {
  const files = ['config.yaml', 'host.json', 'version', 'start', 'update', join('blue', 'slot.json')].map((f) => join(root, f));
  files.push(join(unitDir, `${UNIT}.service`));
  return Object.fromEntries(
    files.map((f) => {
      const s = statSync(f);
      return [f, { text: readFileSync(f, 'utf8'), mtimeMs: s.mtimeMs, mode: s.mode & 0o7777 }];
    }),
  );
}

describe.runIf(asRoot)('host install (daemonless systemctl, private Nginx)', () => {
  let gatewayPid: number | undefined;

  beforeAll(async () => {
    tmp = tmpDir('dp-host-install-');
    root = join(tmp.dir, 'root');
    mkdirSync(root, { mode: 0o755 });
    sysroot = join(tmp.dir, 'sys');
    ({ argv: systemctlArgv, unitDir } = systemctlReplacement(sysroot));
    registry = await startRuntimeRegistry();
    tarball = packTarball(join(tmp.dir, 'pack'));
    pkgVersion = (JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')) as { version: string }).version;
    const [api, http, https] = (await freePorts(3)) as [number, number, number];
    ports = { api, http, https };
    configFile = join(tmp.dir, 'gateway.yaml');
    writeFileSync(
      configFile,
      [
        `stateDir: ${join(root, 'state')}`,
        'nginx: private',
        'apiHost: 127.0.0.1',
        `apiPort: ${api}`,
        'listenHost: 127.0.0.1',
        `httpPort: ${http}`,
        `httpsPort: ${https}`,
        'resyncInterval: 3600',
        'drainPeriod: 5',
        '',
      ].join('\n'),
    );
    first = await install();
    process.stderr.write(`host install: a fresh install took ${first.ms} ms (script start to ready)\n`);
    if (first.exitCode !== 0) process.stderr.write(`${first.stdout}\n${first.stderr}\n`);
    gatewayPid = await listener(ports.api);
  }, 600_000);

  afterAll(async () => {
    if (!tmp) return;
    await execa(systemctlArgv[0]!, [...systemctlArgv.slice(1), 'stop', `${UNIT}.service`], {
      reject: false,
      stdin: 'ignore',
      timeout: 120_000,
    });
    // Whatever outlived the stop: the gateway and its Nginx master (nginx.pid under the state dir).
    const nginxPid = Number(readFileSafe(join(root, 'state', 'nginx', 'nginx.pid')).trim());
    for (const pid of [gatewayPid, nginxPid]) if (pid && alive(pid)) process.kill(pid, 'SIGKILL');
    await registry?.close();
    tmp.cleanup();
  }, 180_000);

  it('installs, starts the unit and the gateway answers /readyz', async () => {
    expect(first.exitCode, first.stderr).toBe(0);
    expect(first.stdout).toContain(`dstack-proxy ${pkgVersion} (blue) is ready at http://127.0.0.1:${ports.api}/readyz`);
    expect(first.stdout).toMatch(/created\s+\S+\/start/);
    const res = await fetch(`http://127.0.0.1:${ports.api}/readyz`);
    expect(res.status).toBe(200);
    // The runtime came from the (loopback) registry: node and npm, once each.
    expect([...registry.hits.values()]).toEqual([1, 1]);
    expect(gatewayPid).toBeDefined();
    // The unit runs the blue slot's own runtime, not the test's node.
    expect(readFileSync(`/proc/${gatewayPid}/cmdline`, 'utf8').split('\0')).toContain(cliOf('blue'));
    const unit = readFileSync(join(unitDir, `${UNIT}.service`), 'utf8');
    expect(unit).toContain(`ExecStart=/bin/sh ${root}/start\n`);
    expect(unit).toContain('TimeoutStopSec=35\n');
    expect(readFileSync(join(root, 'version'), 'utf8')).toBe('blue\n');
    expect(statSync(join(root, 'config.yaml')).mode & 0o777).toBe(0o600);
    expect(statSync(join(root, 'start')).mode & 0o777).toBe(0o755);
    expect(JSON.parse(readFileSync(join(root, 'host.json'), 'utf8'))).toEqual({
      unitName: UNIT,
      unitDir,
      systemctl: systemctlArgv,
      runtimeFrom: registry.url,
    });
  });

  it('host status shows the active slot, its version and runtime, and an empty previous slot', async () => {
    const text = await hostCli(['status', '--root', root]);
    expect(text.exitCode, text.stderr).toBe(0);
    expect(text.stdout).toContain(`active:   blue: ${pkgVersion} from ${tarball}, node ${runtime!.node.version}`);
    expect(text.stdout).toContain('previous: green: empty');
    expect(text.stdout).toContain(`unit:     ${UNIT}.service: active`);
    expect(text.stdout).toContain(`readyz:   http://127.0.0.1:${ports.api}/readyz: 200`);
    const json = await hostCli(['status', '--root', root, '--json']);
    const s = JSON.parse(json.stdout) as { active: { slot: string; version: string; runtime: string }; previous?: unknown };
    expect(s.active).toMatchObject({ slot: 'blue', version: pkgVersion, runtime: runtime!.node.version });
    expect(s.previous).toBeUndefined();
    const none = await hostCli(['status', '--root', join(tmp.dir, 'nowhere')]);
    expect(none.exitCode).toBe(1);
    expect(none.stderr).toContain('is not a gateway host');
  });

  it('a second install changes nothing: same files and mtimes, same gateway, no download', async () => {
    const before = snapshot();
    const hits = new Map(registry.hits);
    const again = await install();
    expect(again.exitCode, again.stderr).toBe(0);
    expect(again.stdout).toContain('nothing to do');
    expect(snapshot()).toEqual(before);
    expect(registry.hits).toEqual(hits);
    expect(await listener(ports.api)).toBe(gatewayPid);
  }, 300_000);

  it('refuses a bad config with one line and writes nothing', async () => {
    const before = snapshot();
    const bad = join(tmp.dir, 'bad.yaml');
    writeFileSync(bad, 'httpPort: 80\nhttpsPort: 80\n');
    const args = installArgs();
    args[args.indexOf('--config') + 1] = bad;
    const r = await hostCli(['install', ...args]);
    expect(r.exitCode).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain(`${bad} is not a valid gateway config`);
    expect(snapshot()).toEqual(before);
  });

  it('systemctl stop stops the gateway', async () => {
    const r = await execa(systemctlArgv[0]!, [...systemctlArgv.slice(1), 'stop', `${UNIT}.service`], {
      reject: false,
      stdin: 'ignore',
      timeout: 120_000,
    });
    expect(r.exitCode, String(r.stderr)).toBe(0);
    expect(await until(async () => (alive(gatewayPid!) ? undefined : true), 30_000)).toBe(true);
    expect(await portOpen(ports.api)).toBe(false);
    expect(await portOpen(ports.http)).toBe(false);
  }, 120_000);
});

function readFileSafe(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
