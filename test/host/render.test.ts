// The texts host install writes: deterministic, their values checked, and the two scripts run
// for real by /bin/sh on a scratch root whose slot `node` is a stand-in printing its argv.

import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  checkPath,
  checkUnitName,
  renderDefaultConfig,
  renderHostSettings,
  renderSlotRecord,
  renderStartScript,
  CRASH_RESTART_AFTER_SECONDS,
  SUCCESSOR_WAIT_SECONDS,
  renderUnit,
  renderUpdateScript,
  stopTimeout,
} from '../../src/host/render.js';
import { readGatewayConfig } from '../../src/host/gateway-config.js';
import { tmpDir } from '../helpers/tmp.js';

describe('renderUnit', () => {
  it('runs the start script with the limits, restart policy and stop timeout a gateway needs', () => {
    const unit = renderUnit({ root: '/opt/dstack-proxy', timeoutStopSec: 60 });
    expect(unit).toContain('\n[Unit]\nDescription=dstack-proxy gateway (/opt/dstack-proxy)\n');
    expect(unit).toContain('After=network-online.target nginx.service\nWants=network-online.target\n');
    for (const line of [
      'ExecStart=/bin/sh /opt/dstack-proxy/start',
      // A reload hands over to a new gateway; a stop goes to the start script alone, which
      // passes it on and exits: the gateway serves on until a restart's new one takes over.
      'ExecReload=/bin/kill -HUP $MAINPID',
      'ExecStop=/bin/kill -TERM $MAINPID',
      'KillMode=process',
      'WorkingDirectory=-/opt/dstack-proxy',
      'Restart=always',
      'RestartSec=2',
      'LimitNOFILE=65535',
      'KillSignal=SIGTERM',
      'TimeoutStopSec=60',
    ]) {
      expect(unit.split('\n')).toContain(line);
    }
    expect(unit).toMatch(/\n\[Install\]\nWantedBy=multi-user.target\n$/);
    expect(renderUnit({ root: '/opt/dstack-proxy', timeoutStopSec: 60 })).toBe(unit);
  });

  it('is sandboxed as far as its work allows: private files, no new privileges, kernel interfaces closed', () => {
    const lines = renderUnit({ root: '/opt/dstack-proxy', timeoutStopSec: 60 }).split('\n');
    for (const line of [
      'UMask=0077',
      'NoNewPrivileges=yes',
      'RestrictSUIDSGID=yes',
      'ProtectKernelTunables=yes',
      'ProtectKernelModules=yes',
      'ProtectKernelLogs=yes',
      'ProtectControlGroups=yes',
      'ProtectClock=yes',
      'ProtectHostname=yes',
      'LockPersonality=yes',
      'RestrictRealtime=yes',
      'RestrictNamespaces=yes',
      'SystemCallArchitectures=native',
    ]) {
      expect(lines).toContain(line);
    }
    // What would break the gateway's work: /etc read-only, a /tmp or devices of its own, no JIT.
    for (const absent of ['ProtectSystem=', 'PrivateTmp=', 'PrivateDevices=', 'MemoryDenyWriteExecute=', 'User=']) {
      expect(
        lines.some((l) => l.startsWith(absent)),
        absent,
      ).toBe(false);
    }
  });

  it("systemd's own parser takes every line of it (systemd-analyze verify: no unknown key, no bad value)", async () => {
    const t = tmpDir('dp-render-unit-');
    const dir = t.dir;
    writeFileSync(join(dir, 'start'), '#!/bin/sh\n');
    const unit = join(dir, 'dstack-proxy-verify.service');
    writeFileSync(unit, renderUnit({ root: dir, timeoutStopSec: 60 }));
    const r = await execa('systemd-analyze', ['verify', unit], { reject: false, cwd: dir });
    const said = `${r.stdout}\n${r.stderr}`;
    expect(said, said).not.toMatch(/Unknown key|Failed to parse|Invalid|unknown/i);
    expect(r.exitCode, said).toBe(0);
    t.cleanup();
  });

  it("gives the gateway's drain period a margin to stop in", () => {
    expect(stopTimeout(30)).toBe(60);
    expect(stopTimeout(0)).toBe(30);
    expect(stopTimeout(2.5)).toBe(33);
    expect(renderUnit({ root: '/r', timeoutStopSec: stopTimeout(5) })).toContain('\nTimeoutStopSec=35\n');
  });

  it('refuses values that would break the unit', () => {
    expect(() => renderUnit({ root: 'relative/root', timeoutStopSec: 60 })).toThrow(/must be an absolute path/);
    expect(() => renderUnit({ root: '/opt/x\nExecStartPre=/bin/rm', timeoutStopSec: 60 })).toThrow(/would misread/);
    expect(() => renderUnit({ root: '/opt/with space', timeoutStopSec: 60 })).toThrow(/would misread/);
    expect(() => renderUnit({ root: '/opt/%n', timeoutStopSec: 60 })).toThrow(/would misread/);
    expect(() => renderUnit({ root: '/opt/x', timeoutStopSec: 0 })).toThrow(/TimeoutStopSec/);
  });
});

describe('checkPath and checkUnitName', () => {
  it('accepts plain absolute paths (a trailing slash dropped) and unit names', () => {
    expect(checkPath('r', '/opt/dstack-proxy/')).toBe('/opt/dstack-proxy');
    expect(checkPath('r', '/tmp/dp-host-AbC_1.2@x')).toBe('/tmp/dp-host-AbC_1.2@x');
    expect(checkUnitName('dstack-proxy')).toBe('dstack-proxy');
    expect(checkUnitName('dstack.gateway')).toBe('dstack.gateway');
    expect(checkUnitName('gw@blue_1')).toBe('gw@blue_1');
  });

  it('refuses what a shell or systemd would read differently', () => {
    for (const p of ["/opt/it's", '/opt/$HOME', '/opt/a"b', '/opt/a\\b', '/opt/a\tb', '/opt/`x`']) {
      expect(() => checkPath('--root', p), p).toThrow(/--root .* holds a character/);
    }
    for (const n of ['', 'a b', 'x.service', 'a/b', 'a\nb', 'é']) expect(() => checkUnitName(n), n).toThrow(/unit name/);
  });
});

describe('renderDefaultConfig', () => {
  it('is a valid gateway config for the system Nginx with the state under the root', () => {
    const t = tmpDir('dp-render-');
    try {
      const file = join(t.dir, 'config.yaml');
      writeFileSync(file, renderDefaultConfig('/opt/dstack-proxy'));
      const o = readGatewayConfig(file);
      expect(o).toMatchObject({
        stateDir: '/opt/dstack-proxy/state',
        nginx: 'system',
        sitesDir: '/etc/nginx/dstack-proxy',
        nginxConf: '/etc/nginx/nginx.conf',
      });
    } finally {
      t.cleanup();
    }
  });
});

describe('renderHostSettings and renderSlotRecord', () => {
  it('writes exactly the fields, in a fixed order', () => {
    const text = renderHostSettings({
      systemctl: ['python3', '/x/systemctl', '--root=/s'],
      unitDir: '/etc/systemd/system',
      unitName: 'dstack-proxy',
    });
    expect(JSON.parse(text)).toEqual({
      unitName: 'dstack-proxy',
      unitDir: '/etc/systemd/system',
      systemctl: ['python3', '/x/systemctl', '--root=/s'],
    });
    expect(text.indexOf('unitName')).toBeLessThan(text.indexOf('systemctl'));
    expect(
      JSON.parse(renderHostSettings({ unitName: 'u', unitDir: '/d', systemctl: ['systemctl'], runtimeFrom: 'http://127.0.0.1:1' })),
    ).toHaveProperty('runtimeFrom', 'http://127.0.0.1:1');
    expect(() => renderHostSettings({ unitName: 'u', unitDir: '/d', systemctl: [] })).toThrow(/empty/);
    expect(() => renderHostSettings({ unitName: 'u', unitDir: '/d', systemctl: ['systemctl', 'a\nb'] })).toThrow(/control character/);
    const record = renderSlotRecord({ package: 'dstack-proxy@0.2.0', runtime: '20.20.2', installedAt: '2026-01-01T00:00:00.000Z' });
    expect(JSON.parse(record)).toEqual({ package: 'dstack-proxy@0.2.0', runtime: '20.20.2', installedAt: '2026-01-01T00:00:00.000Z' });
    expect(record.endsWith('}\n')).toBe(true);
  });
});

describe('the start and update scripts, run by /bin/sh', () => {
  let t: { dir: string; cleanup: () => void };
  let root: string;

  beforeAll(() => {
    t = tmpDir('dp-render-sh-');
    root = join(t.dir, 'root');
    for (const slot of ['blue', 'green']) {
      mkdirSync(join(root, slot), { recursive: true });
      // The slot's node: prints which slot it is, its cwd and its arguments, one per line.
      writeFileSync(join(root, slot, 'node'), `#!/bin/sh\necho ${slot}\npwd\nfor a in "$@"; do echo "$a"; done\n`);
      chmodSync(join(root, slot, 'node'), 0o755);
    }
    writeFileSync(join(root, 'start'), renderStartScript(root));
    writeFileSync(join(root, 'update'), renderUpdateScript(root));
  });
  afterAll(() => t.cleanup());

  const run = async (script: string, args: string[] = []) => {
    const r = await execa('/bin/sh', [join(root, script), ...args], { reject: false, cwd: '/' });
    return { exitCode: r.exitCode, lines: String(r.stdout).split('\n'), stderr: String(r.stderr) };
  };

  it('start runs blue when there is no version file, from the root', async () => {
    const r = await run('start');
    expect(r.exitCode).toBe(0);
    expect(r.lines).toEqual([
      'blue',
      root,
      join(root, 'blue', 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js'),
      'gateway',
      '--config',
      join(root, 'config.yaml'),
      '--take-over',
      'true',
      '--successor-wait',
      String(SUCCESSOR_WAIT_SECONDS),
    ]);
  });

  it('start runs the slot the version file names (with or without a newline)', async () => {
    writeFileSync(join(root, 'version'), 'green\n');
    expect((await run('start')).lines[0]).toBe('green');
    writeFileSync(join(root, 'version'), 'green');
    expect((await run('start')).lines[0]).toBe('green');
  });

  it('start refuses anything but blue or green', async () => {
    writeFileSync(join(root, 'version'), '../../bin\n');
    const r = await run('start');
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toContain(`${root}/version holds '../../bin', not blue or green`);
  });

  it('start hands over on SIGHUP: the active slot again with --take-over true; a failed one leaves the old serving', async () => {
    // Slots whose node logs its start and runs until told to stop; the first take-over fails.
    const h = join(t.dir, 'hup');
    const log = join(h, 'log');
    for (const slot of ['blue', 'green']) {
      mkdirSync(join(h, slot), { recursive: true });
      writeFileSync(
        join(h, slot, 'node'),
        `#!/bin/sh\necho "${slot} $$ $*" >>${log}\n` +
          `if [ -f ${h}/started ] && [ ! -f ${h}/failed ]; then : >${h}/failed; exit 1; fi\n: >${h}/started\n` +
          `trap 'echo "${slot} $$ stopped" >>${log}; exit 0' TERM\nwhile :; do sleep 0.05; done\n`,
      );
      chmodSync(join(h, slot, 'node'), 0o755);
    }
    writeFileSync(join(h, 'start'), renderStartScript(h));
    const lines = (): string[] => (existsSync(log) ? readFileSync(log, 'utf8').trim().split('\n') : []);
    const until = async (n: number): Promise<string[]> => {
      for (let i = 0; i < 200 && lines().length < n; i++) await new Promise((r) => setTimeout(r, 25));
      return lines();
    };
    const flags = `--take-over true --successor-wait ${SUCCESSOR_WAIT_SECONDS}`;
    const sh = execa('/bin/sh', [join(h, 'start')], { reject: false });
    expect((await until(1))[0]).toMatch(new RegExp(`^blue \\d+ .*gateway --config .*config\\.yaml ${flags}$`));
    writeFileSync(join(h, 'version'), 'green\n');
    // The first take-over fails: blue goes on, and the script with it.
    sh.kill('SIGHUP');
    expect((await until(2))[1]).toMatch(new RegExp(`^green \\d+ .* ${flags}$`));
    await new Promise((r) => setTimeout(r, 200));
    expect(sh.exitCode).toBeNull();
    // The second goes through: green runs; the one it took over from is told to stop (as the
    // gateway does, by its pid), and the script stays with green.
    sh.kill('SIGHUP');
    const third = (await until(3))[2]!;
    expect(third).toMatch(new RegExp(`^green \\d+ .* ${flags}$`));
    const bluePid = Number(lines()[0]!.split(' ')[1]);
    process.kill(bluePid, 'SIGTERM');
    expect((await until(4))[3]).toBe(`blue ${bluePid} stopped`);
    await new Promise((r) => setTimeout(r, 200));
    expect(sh.exitCode).toBeNull();
    // A stop reaches the serving gateway, and the script exits without waiting for it (the
    // gateway serves on for a restart's new one).
    sh.kill('SIGTERM');
    const r = await sh;
    expect(r.exitCode).toBe(0);
    expect((await until(5))[4]).toBe(`green ${third.split(' ')[1]} stopped`);
  }, 30_000);

  it('start runs a gateway that ended on its own again, unless it ended soon after it started', async () => {
    // Each start of the slot's node is logged; the first runs past the crash-restart bound and
    // exits 3, the second exits 4 at once.
    const h = join(t.dir, 'crash');
    const log = join(h, 'log');
    mkdirSync(join(h, 'blue'), { recursive: true });
    writeFileSync(
      join(h, 'blue', 'node'),
      `#!/bin/sh\necho "start $$" >>${log}\n` +
        `if [ ! -f ${h}/ran ]; then : >${h}/ran; sleep ${CRASH_RESTART_AFTER_SECONDS + 1}; exit 3; fi\nexit 4\n`,
    );
    chmodSync(join(h, 'blue', 'node'), 0o755);
    writeFileSync(join(h, 'start'), renderStartScript(h));
    const r = await execa('/bin/sh', [join(h, 'start')], { reject: false });
    expect(r.exitCode).toBe(4);
    expect(readFileSync(log, 'utf8').trim().split('\n')).toHaveLength(2);
    expect(r.stderr).toContain('the gateway exited 3; starting it again');
  }, 30_000);

  it("update runs the active slot's host update with the root and the arguments", async () => {
    writeFileSync(join(root, 'version'), 'green\n');
    const r = await run('update', ['dstack-proxy@0.2.0', '0.2.0']);
    expect(r.exitCode).toBe(0);
    expect(r.lines.slice(0, 1).concat(r.lines.slice(2))).toEqual([
      'green',
      join(root, 'green', 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js'),
      'host',
      'update',
      '--root',
      root,
      'dstack-proxy@0.2.0',
      '0.2.0',
    ]);
    writeFileSync(join(root, 'version'), 'red\n');
    expect((await run('update', ['x'])).exitCode).toBe(1);
  });

  it('both scripts parse as POSIX sh (dash -n)', async () => {
    for (const s of ['start', 'update']) expect((await execa('dash', ['-n', join(root, s)], { reject: false })).exitCode).toBe(0);
  });
});
