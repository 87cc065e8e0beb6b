// `host install` for real, as root, in temporary dirs only: the pinned Node runtime (the real
// registry packages, served from loopback), a tarball of this checkout installed into the blue
// slot, the unit started and stopped by Debian's daemonless systemctl replacement on a
// temporary unit tree, the gateway on its private Nginx on loopback ports. One install is
// shared by the cases; a second run must change nothing.

import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { installHost, logHint, NotReadyError, type InstallOptions } from '../../src/host/install.js';
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

// What install decides, case by case, without a service manager: systemctl is a small script
// that records its arguments and keeps an "active" flag, and /readyz is a loopback HTTP server
// whose answer the test sets. The unit never runs anything; the decisions are what is checked.
describe('host install decisions (recorded systemctl, loopback /readyz)', () => {
  let t: { dir: string; cleanup: () => void };
  let r: string;
  let units: string;
  let calls: string;
  let readyStatus = 200;
  let server: Server;
  let apiPort: number;
  let cfgA: string;
  let cfgB: string;
  let argv: string[];

  const options = (over: Partial<InstallOptions> = {}): InstallOptions => ({
    root: r,
    slot: 'blue',
    package: '/tmp/dstack-proxy-9.9.9.tgz',
    runtime: '20.20.2',
    configFile: cfgA,
    unitName: 'dp-decisions',
    unitDir: units,
    systemctl: argv,
    readyTimeoutMs: 5000,
    now: () => new Date('2026-01-02T03:04:05.000Z'),
    ...over,
  });
  const recorded = (): string[] => {
    const lines = readFileSync(calls, 'utf8').split('\n').filter(Boolean);
    writeFileSync(calls, '');
    return lines.filter((l) => !l.startsWith('is-active'));
  };

  beforeAll(async () => {
    t = tmpDir('dp-host-decide-');
    r = join(t.dir, 'root');
    units = join(t.dir, 'units');
    calls = join(t.dir, 'calls');
    mkdirSync(join(r, 'blue', 'node_modules', 'dstack-proxy', 'dist', 'src'), { recursive: true });
    mkdirSync(units);
    writeFileSync(join(r, 'blue', 'node'), '');
    writeFileSync(join(r, 'blue', 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js'), '');
    writeFileSync(join(r, 'blue', 'node_modules', 'dstack-proxy', 'package.json'), '{"name":"dstack-proxy","version":"9.9.9"}\n');
    writeFileSync(calls, '');
    const fake = join(t.dir, 'systemctl');
    writeFileSync(
      fake,
      `#!/bin/sh
case "$1" in --root=*) shift ;; esac
echo "$*" >>'${calls}'
case "$1" in
  is-active) if [ -f '${t.dir}/active' ]; then echo active; exit 0; fi; echo inactive; exit 3 ;;
  start | restart) touch '${t.dir}/active' ;;
  stop) rm -f '${t.dir}/active' ;;
  enable) mkdir -p '${units}/multi-user.target.wants' && ln -sf "../$2" '${units}/multi-user.target.wants/'"$2" ;;
esac
exit 0
`,
    );
    argv = ['sh', fake, `--root=${join(t.dir, 'sys')}`];
    server = createServer((req, res) => {
      res.writeHead(req.url === '/readyz' ? readyStatus : 404, { 'content-type': 'application/json' });
      res.end(readyStatus === 200 ? '{"ready":true}' : '{"ready":false,"reason":"nginx is not up"}');
    });
    await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
    apiPort = (server.address() as AddressInfo).port;
    cfgA = join(t.dir, 'a.yaml');
    cfgB = join(t.dir, 'b.yaml');
    writeFileSync(cfgA, `stateDir: ${join(r, 'state')}\napiPort: ${apiPort}\n`);
    writeFileSync(cfgB, `stateDir: ${join(r, 'state')}\napiPort: ${apiPort}\ndrainPeriod: 10\n`);
  });
  afterAll(async () => {
    await new Promise<void>((ok) => server.close(() => ok()));
    t.cleanup();
  });

  it('a first install writes every file, reloads, enables and starts', async () => {
    const report = await installHost(options());
    expect(Object.values(report.files)).toEqual(Array(7).fill('created'));
    expect(recorded()).toEqual(['daemon-reload', 'enable dp-decisions.service', 'start dp-decisions.service']);
    expect(report).toMatchObject({ nothingToDo: false, active: 'blue', version: '9.9.9', url: `http://127.0.0.1:${apiPort}/readyz` });
    expect(JSON.parse(readFileSync(join(r, 'blue', 'slot.json'), 'utf8'))).toEqual({
      package: '/tmp/dstack-proxy-9.9.9.tgz',
      runtime: '20.20.2',
      installedAt: '2026-01-02T03:04:05.000Z',
    });
    expect(readFileSync(join(units, 'dp-decisions.service'), 'utf8')).toContain('\nTimeoutStopSec=60\n');
  });

  it('the same install again does nothing, even with another package spec or time', async () => {
    const report = await installHost(options({ package: 'dstack-proxy@9.9.9', now: () => new Date() }));
    expect(report.nothingToDo).toBe(true);
    expect(new Set(Object.values(report.files))).toEqual(new Set(['unchanged']));
    expect(recorded()).toEqual([]);
  });

  it('a changed config restarts (and a changed unit reloads first)', async () => {
    const report = await installHost(options({ configFile: cfgB }));
    expect(report.files[join(r, 'config.yaml')]).toBe('updated');
    expect(report.files[join(units, 'dp-decisions.service')]).toBe('updated');
    expect(recorded()).toEqual(['daemon-reload', 'restart dp-decisions.service']);
    // No --config: the host's own config is kept.
    expect((await installHost(options({ configFile: undefined }))).nothingToDo).toBe(true);
    expect(readFileSync(join(r, 'config.yaml'), 'utf8')).toContain('drainPeriod: 10');
  });

  it('a start script that was edited is put back and restarts, without a reload', async () => {
    writeFileSync(join(r, 'start'), '#!/bin/sh\nexit 1\n');
    const report = await installHost(options({ configFile: cfgB }));
    expect(report.files[join(r, 'start')]).toBe('updated');
    expect(recorded()).toEqual(['restart dp-decisions.service']);
    expect(statSync(join(r, 'start')).mode & 0o777).toBe(0o755);
  });

  it('a stopped unit is started; an existing version file is never switched', async () => {
    rmSync(join(t.dir, 'active'));
    writeFileSync(join(r, 'version'), 'green\n');
    const report = await installHost(options({ configFile: cfgB }));
    expect(recorded()).toEqual(['start dp-decisions.service']);
    expect(readFileSync(join(r, 'version'), 'utf8')).toBe('green\n');
    expect(report.active).toBe('green');
    writeFileSync(join(r, 'version'), 'blue\n');
  });

  it('not ready: one line with the last /readyz answer and where the logs are', async () => {
    readyStatus = 503;
    try {
      const err = await installHost(options({ configFile: cfgB, readyTimeoutMs: 1000 })).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(NotReadyError);
      const message = (err as Error).message;
      expect(message).not.toContain('\n');
      expect(message).toContain(`dp-decisions.service is not ready after 1 s: http://127.0.0.1:${apiPort}/readyz answered 503`);
      expect(message).toContain('nginx is not up');
      expect(message).toContain(`its logs: ${join(t.dir, 'sys', 'var', 'log', 'journal', 'dp-decisions.service.log')}`);
    } finally {
      readyStatus = 200;
    }
  });

  it('refuses bad input before writing anything', async () => {
    const before = readFileSync(join(r, 'config.yaml'), 'utf8');
    const bad = join(t.dir, 'bad.yaml');
    writeFileSync(bad, 'nginx: system\n');
    await expect(installHost(options({ configFile: bad }))).rejects.toThrow(
      /bad.yaml is not a valid gateway config: --sites-dir is required/,
    );
    await expect(installHost(options({ configFile: join(t.dir, 'none.yaml') }))).rejects.toThrow(/none.yaml: no such file/);
    await expect(installHost(options({ unitName: 'a b' }))).rejects.toThrow(/unit name/);
    await expect(installHost(options({ unitDir: 'units' }))).rejects.toThrow(/--unit-dir must be an absolute path/);
    await expect(installHost(options({ slot: 'green' }))).rejects.toThrow(/install the runtime and the package into green first/);
    writeFileSync(join(r, 'version'), 'purple\n');
    await expect(installHost(options({ configFile: cfgA }))).rejects.toThrow(/version holds "purple", not blue or green/);
    writeFileSync(join(r, 'version'), 'blue\n');
    expect(readFileSync(join(r, 'config.yaml'), 'utf8')).toBe(before);
    expect(recorded()).toEqual([]);
  });

  it('names the journal under systemd and the log file under the daemonless replacement', () => {
    expect(logHint({ unitName: 'u', systemctl: ['python3', '/x/systemctl', '--root=/s'] })).toBe('/s/var/log/journal/u.service.log');
    expect(logHint({ unitName: 'u', systemctl: ['/usr/bin/systemctl3.py'] })).toBe('/var/log/journal/u.service.log');
  });
});
