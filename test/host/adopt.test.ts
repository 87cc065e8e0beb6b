// `host adopt` on a fake host laid out as dstack provisions one (test/host/dstack-layout.ts):
// the real Nginx running on its Ubuntu-like conf, dstack's unit running under the daemonless
// systemctl. After adopting: dstack's app stopped, its files moved (not deleted), our config,
// includes and update.sh in place, nginx -t passing, and a second run changing nothing.

import { execa } from 'execa';
import { readFileSync } from 'node:fs';
import { lstat, mkdir, readFile, readdir, readlink, rename, stat, symlink, writeFile } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import { request } from 'node:http';
import { connect as tlsConnect } from 'node:tls';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { hostAdoptCommand } from '../../src/cli/host-adopt.js';
import { UPDATE_SH_MARKER, adoptHost, type AdoptOptions } from '../../src/host/adopt.js';
import { readGatewayConfig } from '../../src/host/gateway-config.js';
import { BACKUP_SUFFIX } from '../../src/host/nginx-conf.js';
import { dstackPaths, dstackProjectKey, registerServicePayload } from '../compat/dstack/fixtures.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { DSTACK_LOG_FORMAT_CONF, DSTACK_UPDATE_SH, makeDstackLayout, type DstackLayout } from './dstack-layout.js';
import { INSTALL_SCRIPT, packTarball, scriptPins, startRuntimeRegistry } from './fixtures.js';

const layouts: DstackLayout[] = [];
afterEach(async () => {
  for (const l of layouts.splice(0)) await l.cleanup();
});

async function layout(): Promise<DstackLayout> {
  const l = await makeDstackLayout();
  layouts.push(l);
  return l;
}

function options(l: DstackLayout, over: Partial<AdoptOptions> = {}): AdoptOptions {
  return {
    root: l.root,
    dstackHome: l.dstackHome,
    nginxConf: l.nginxConf,
    sitesEnabled: l.sitesEnabled,
    sitesDir: l.sitesDir,
    defaultSite: 'keep',
    letsencrypt: l.letsencrypt,
    accessLog: l.accessLog,
    systemctl: l.systemctl,
    unitDir: l.unitDir,
    nginxBin: 'nginx',
    snapBin: join(l.dir, 'no-snap-here'),
    extraConfig: { listenHost: '127.0.0.1', httpPort: String(l.httpPort), httpsPort: String(l.httpsPort) },
    dryRun: false,
    install: { readyTimeoutMs: 60_000 },
    ...over,
  };
}

/** GET http://127.0.0.1:<port>/ with a Host header: status and body. */
function get(port: number, host: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/', headers: { host } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function systemctl(l: DstackLayout, ...args: string[]) {
  return execa(l.systemctl[0]!, [...l.systemctl.slice(1), ...args], { reject: false });
}

/** Every file under `dir` with its content (or link target) and mode: a snapshot to compare. */
async function tree(dir: string, skip: (p: string) => boolean = () => false): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (d: string) => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (skip(p)) continue;
      if (e.isDirectory()) await walk(p);
      else if (e.isSymbolicLink()) out[p] = `-> ${await readlink(p)}`;
      else if (e.isFile()) {
        const st = await stat(p);
        out[p] = `${(st.mode & 0o7777).toString(8)} ${st.mtimeMs} ${readFileSync(p, 'utf8').length}`;
      }
    }
  };
  await walk(dir);
  return out;
}

/** Only what a run changes: logs and pid files of the running processes are not its doing. */
const volatile = (p: string) => /\/(var\/log|run|sysroot\/var|sysroot\/run)\b/.test(p) || p.endsWith('.pid');

describe('host adopt', () => {
  it("takes over dstack's host keeping the default site, and a second run changes nothing", async () => {
    const l = await layout();
    await l.startNginx();
    expect((await get(l.defaultPort, 'unknown.example')).body).toContain('Welcome to nginx!');
    expect((await systemctl(l, 'is-active', 'dstack.gateway')).stdout.trim()).toBe('active');
    // What dstack's update.sh would call: a stand-in for our <root>/update that records its argv.
    await mkdir(l.root, { recursive: true });
    await writeFile(join(l.root, 'update'), `echo "update called with $# arguments" > ${join(l.dir, 'update-called')}\n`);
    const originalConf = await readFile(l.nginxConf, 'utf8');

    const lines: string[] = [];
    const r = await adoptHost(options(l), (s) => lines.push(s));
    const out = lines.join('\n');
    expect(r.changed).toBe(true);
    for (const step of ['a.', 'b.', 'c.', 'd.', 'e.', 'f.', 'g.', 'h.']) expect(out).toContain(`\n${step} `.slice(step === 'a.' ? 1 : 0));
    expect(out).toContain("h. state: none carried over; dstack's server registers");
    // Without a slot of ours installed, the unit step is named as not done.
    expect(r.missing).toHaveLength(1);
    expect(r.missing[0]).toMatch(/^f: our unit dstack\.gateway is not installed: .* has no installed dstack-proxy slot/);

    // a. dstack's app is stopped and its unit disabled and moved away.
    expect((await systemctl(l, 'is-active', 'dstack.gateway')).stdout.trim()).not.toBe('active');
    const appPid = Number((await readFile(l.appPidFile, 'utf8')).trim());
    expect(await eventually(() => (alive(appPid) ? undefined : true), 10_000)).toBe(true);
    const adopted = r.adoptedDir!;
    expect(adopted).toMatch(new RegExp(`^${l.root}/adopted/\\d{8}T\\d{6}Z$`));
    const unitFile = join(l.unitDir, 'dstack.gateway.service');
    await expect(lstat(unitFile)).rejects.toThrow(/ENOENT/);
    expect(await readFile(join(adopted, unitFile), 'utf8')).toContain(`ExecStart=/bin/sh ${l.dstackHome}/start.sh`);

    // b. dstack's files moved, with their paths recorded; the default site kept.
    expect((await readdir(l.sitesEnabled)).sort()).toEqual(['default']);
    const logFormat = join(l.sitesEnabled, '00-log-format.conf');
    const site = join(l.sitesEnabled, `443-${l.domain}.conf`);
    expect(await readFile(join(adopted, logFormat), 'utf8')).toBe(DSTACK_LOG_FORMAT_CONF);
    expect((await stat(join(adopted, site))).mode & 0o777).toBe(0o600);
    const updateSh = join(l.dstackHome, 'update.sh');
    expect((await readFile(join(adopted, 'moved.txt'), 'utf8')).trim().split('\n').sort()).toEqual(
      [logFormat, site, unitFile, updateSh].sort(),
    );

    // c. config.yaml, read with the gateway's own option table.
    const config = readGatewayConfig(join(l.root, 'config.yaml'));
    expect(config).toMatchObject({
      nginx: 'system',
      sitesDir: l.sitesDir,
      nginxConf: l.nginxConf,
      serverUrl: `unix-dir:${l.dstackHome}/server-connections`,
      accessLog: l.accessLog,
      certbotConfigDir: l.letsencrypt,
      dstackCompat: 'true',
      apiHost: '127.0.0.1',
      apiPort: 8000,
      stateDir: join(l.root, 'state'),
      defaultServer: 'false',
      reloadCommand: `nginx -c ${l.nginxConf} -s reload`,
      httpPort: l.httpPort,
    });

    // d. nginx.conf patched, tested, backed up; Nginx reloaded without dstack's sites, and the
    //    default site still answers unknown hosts.
    const conf = await readFile(l.nginxConf, 'utf8');
    expect(conf).toContain(`\tinclude ${l.sitesDir}/*.conf;\n\tinclude ${l.sitesDir}/sites/*.conf;\n}`);
    expect(conf).toContain('\tserver_names_hash_bucket_size 128;');
    expect(conf).toContain('worker_rlimit_nofile 65535;');
    expect(await readFile(`${l.nginxConf}${BACKUP_SUFFIX}`, 'utf8')).toBe(originalConf);
    await execa('nginx', ['-t', '-q', '-c', l.nginxConf]);
    expect((await stat(l.sitesDir)).mode & 0o777).toBe(0o755);
    expect((await get(l.defaultPort, 'unknown.example')).body).toContain('Welcome to nginx!');
    await expect(get(l.httpPort, l.domain)).rejects.toThrow(/ECONNREFUSED/);

    // e. update.sh is ours: dstack's arguments are dropped, our update runs with none.
    const ours = await readFile(updateSh, 'utf8');
    expect(ours).toContain(UPDATE_SH_MARKER);
    expect(ours).toContain(`exec /bin/sh ${l.root}/update\n`);
    expect(await readFile(join(adopted, updateSh), 'utf8')).toBe(DSTACK_UPDATE_SH);
    // As dstack's server runs it (a copy, in the home's parent).
    await execa(
      '/bin/sh',
      [
        '-c',
        'cp dstack/update.sh dstack/_update.sh && sh dstack/_update.sh "dstack-gateway @ https://example.test/x.whl" 0.19.2 && rm dstack/_update.sh',
      ],
      {
        cwd: join(l.dstackHome, '..'),
      },
    );
    expect(await readFile(join(l.dir, 'update-called'), 'utf8')).toBe('update called with 0 arguments\n');
    // start.sh is left alone.
    expect(await readFile(join(l.dstackHome, 'start.sh'), 'utf8')).toContain('bin/uvicorn');

    // Certificates untouched.
    expect(await readlink(join(l.letsencrypt, 'live', l.domain, 'fullchain.pem'))).toBe(`../../archive/${l.domain}/fullchain1.pem`);

    // A second run: nothing changes, nothing moves.
    const before = await tree(l.dir, volatile);
    const again: string[] = [];
    const r2 = await adoptHost(options(l), (s) => again.push(s));
    expect(r2.changed).toBe(false);
    expect(r2.adoptedDir).toBeUndefined();
    expect(again.join('\n')).toContain('nothing to change: already adopted');
    expect(await tree(l.dir, volatile)).toEqual(before);
    expect(await readdir(join(l.root, 'adopted'))).toHaveLength(1);
  });

  it('--default-site remove moves the default site away too', async () => {
    const l = await layout();
    await l.startNginx();
    const r = await adoptHost(options(l, { defaultSite: 'remove' }), () => {});
    expect(await readdir(l.sitesEnabled)).toEqual([]);
    const moved = join(r.adoptedDir!, l.sitesEnabled, 'default');
    expect((await lstat(moved)).isSymbolicLink()).toBe(true);
    expect(await readlink(moved)).toBe(join(l.dir, 'etc', 'nginx', 'sites-available', 'default'));
    const config = readGatewayConfig(join(l.root, 'config.yaml'));
    expect(config.defaultServer).toBe('true');
    await execa('nginx', ['-t', '-q', '-c', l.nginxConf]);
    await expect(get(l.defaultPort, 'unknown.example')).rejects.toThrow(/ECONNREFUSED/);
  });

  it("keeps an operator's config.yaml, and disables certbot's own renewal timers", async () => {
    const l = await layout();
    await l.startNginx();
    await mkdir(l.root, { recursive: true });
    const mine = `nginx: system\nsitesDir: ${l.sitesDir}\nnginxConf: ${l.nginxConf}\napiPort: 8000\n`;
    await writeFile(join(l.root, 'config.yaml'), mine);
    // certbot from apt: its timer, enabled; from snap: a stand-in `snap` that records its calls.
    await writeFile(
      join(l.unitDir, 'certbot.timer'),
      '[Unit]\nDescription=Run certbot twice daily\n\n[Timer]\nOnCalendar=*-*-* 00,12:00:00\n\n[Install]\nWantedBy=timers.target\n',
    );
    await systemctl(l, 'enable', 'certbot.timer');
    expect((await systemctl(l, 'is-enabled', 'certbot.timer')).stdout.trim()).toBe('enabled');
    const snap = join(l.dir, 'snap');
    const calls = join(l.dir, 'snap-calls');
    await writeFile(
      snap,
      `#!/bin/sh\necho "$*" >> ${calls}\nif [ "$1" = services ]; then echo "Service        Startup  Current   Notes"; echo "certbot.renew  enabled  inactive  timer-activated"; fi\n`,
      { mode: 0o755 },
    );
    const lines: string[] = [];
    await adoptHost(options(l, { snapBin: snap }), (s) => lines.push(s));
    expect(await readFile(join(l.root, 'config.yaml'), 'utf8')).toBe(mine);
    expect(lines.join('\n')).toContain('exists: kept as it is');
    expect((await readFile(calls, 'utf8')).trim().split('\n')).toEqual(['services certbot.renew', 'stop --disable certbot.renew']);
    expect((await systemctl(l, 'is-enabled', 'certbot.timer')).stdout.trim()).not.toBe('enabled');
  });

  it('--dry-run prints the steps and changes nothing', async () => {
    const l = await layout();
    const before = await tree(l.dir, volatile);
    const out: string[] = [];
    const code = await hostAdoptCommand.run(
      [
        '--root',
        l.root,
        '--dstack-home',
        l.dstackHome,
        '--nginx-conf',
        l.nginxConf,
        '--sites-enabled',
        l.sitesEnabled,
        '--sites-dir',
        l.sitesDir,
        '--letsencrypt',
        l.letsencrypt,
        '--access-log',
        l.accessLog,
        '--systemctl',
        l.systemctl.join(' '),
        '--unit-dir',
        l.unitDir,
        '--dry-run',
      ],
      { stdout: (s) => out.push(s), stderr: (s) => out.push(s), readStdin: () => Promise.resolve(''), isTTY: false, env: {} },
    );
    const text = out.join('');
    expect(text).toContain('(dry run)   move');
    expect(text).toContain(`(dry run)   write ${l.root}/config.yaml`);
    expect(text).toContain('(dry run)   include');
    expect(code).toBe(1); // no slot of ours installed: the unit step cannot run
    expect(await tree(l.dir, volatile)).toEqual(before);
    expect((await systemctl(l, 'is-active', 'dstack.gateway')).stdout.trim()).toBe('active');
  });

  it("refuses a host that is not dstack's, before changing anything", async () => {
    const l = await layout();
    await writeFile(join(l.dstackHome, 'version'), 'purple\n');
    const before = await tree(l.dir, volatile);
    await expect(adoptHost(options(l), () => {})).rejects.toThrow(/is not a dstack gateway home: .*names "purple"/);
    await expect(adoptHost(options(l, { dstackHome: join(l.dir, 'nowhere') }), () => {})).rejects.toThrow(/no readable/);
    await expect(adoptHost(options(l, { sitesDir: '/etc/nginx/a b' }), () => {})).rejects.toThrow(/absolute path/);
    expect(await tree(l.dir, volatile)).toEqual(before);
  });
});

// The whole takeover: our package in a slot (the pinned runtime from a loopback stand-in
// registry, this checkout's tarball installed by the runtime's npm, as the bootstrap does),
// then `host adopt` through that slot's own CLI: our gateway runs under dstack's unit name and
// an unmodified server's registration is served by the system Nginx. Needs `npm run build`.
describe.runIf(process.getuid?.() === 0)('host adopt with our package installed', () => {
  let l: DstackLayout;
  let registry: Awaited<ReturnType<typeof startRuntimeRegistry>> | undefined;
  let apiPort: number;

  afterAll(async () => {
    // The layout's cleanup stops dstack.gateway (ours by then) and its Nginx.
    const pid = apiPort ? await listenerPid(apiPort) : undefined;
    if (pid) process.kill(pid, 'SIGKILL');
    await registry?.close();
  }, 120_000);

  it('runs our gateway as dstack.gateway, serving what the dstack API registers', async () => {
    l = await layout();
    await l.startNginx();
    registry = await startRuntimeRegistry();
    const tarball = packTarball(join(l.dir, 'pack'));
    const { NODE_VERSION: node, NPM_VERSION: npm } = scriptPins();
    // The slot, as the bootstrap fills it: the runtime, then the package by the runtime's npm.
    await execa('sh', [INSTALL_SCRIPT, 'runtime', '--root', l.root, '--runtime-from', registry.url], { stdin: 'ignore' });
    const nodeDir = join(l.root, 'runtime', `node-${node}`);
    const stage = join(l.root, '.tmp-blue');
    await mkdir(stage, { recursive: true, mode: 0o755 });
    await execa(
      join(nodeDir, 'bin', 'node'),
      [
        join(l.root, 'runtime', `npm-${npm}`, 'bin', 'npm-cli.js'),
        'install',
        '--prefix',
        stage,
        '--omit=dev',
        '--omit=optional',
        '--no-audit',
        '--no-fund',
        '--no-save',
        '--no-package-lock',
        tarball,
      ],
      { stdin: 'ignore', env: { PATH: `${join(nodeDir, 'bin')}:${process.env.PATH ?? ''}` }, timeout: 300_000 },
    );
    await symlink(`../runtime/node-${node}/bin/node`, join(stage, 'node'));
    await rename(stage, join(l.root, 'blue'));

    [apiPort] = (await freePorts(1)) as [number];
    // certbot stand-in: any ACME attempt is recorded (and fails, on loopback only).
    const certbotCalls = join(l.dir, 'certbot-calls');
    const certbot = join(l.dir, 'certbot');
    await writeFile(certbot, `#!/bin/sh\necho "$*" >> ${certbotCalls}\nexit 1\n`, { mode: 0o755 });
    const adopt = (extra: string[] = []) =>
      execa(
        join(l.root, 'blue', 'node'),
        [
          join(l.root, 'blue', 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js'),
          'host',
          'adopt',
          '--root',
          l.root,
          '--dstack-home',
          l.dstackHome,
          '--nginx-conf',
          l.nginxConf,
          '--sites-enabled',
          l.sitesEnabled,
          '--sites-dir',
          l.sitesDir,
          '--letsencrypt',
          l.letsencrypt,
          '--access-log',
          l.accessLog,
          '--systemctl',
          l.systemctl.join(' '),
          '--unit-dir',
          l.unitDir,
          '--slot',
          'blue',
          '--package',
          tarball,
          '--runtime',
          node!,
          '--runtime-from',
          registry!.url,
          '--ready-timeout',
          '90',
          '--set',
          `apiPort=${apiPort}`,
          '--set',
          'listenHost=127.0.0.1',
          '--set',
          `httpPort=${l.httpPort}`,
          '--set',
          `httpsPort=${l.httpsPort}`,
          '--set',
          'resyncInterval=3600',
          '--set',
          'drainPeriod=5',
          '--set',
          `certbotBin=${certbot}`,
          ...extra,
        ],
        { reject: false, stdin: 'ignore', timeout: 300_000 },
      );
    const first = await adopt();
    expect(first.exitCode, `${first.stdout}\n${first.stderr}`).toBe(0);
    expect(first.stdout).toContain(`is ready at http://127.0.0.1:${apiPort}/readyz`);

    // Our unit under dstack's name, active; dstack's app is not what runs.
    const unit = await readFile(join(l.unitDir, 'dstack.gateway.service'), 'utf8');
    expect(unit).toContain(`ExecStart=/bin/sh ${l.root}/start\n`);
    expect((await systemctl(l, 'is-active', 'dstack.gateway')).stdout.trim()).toBe('active');
    expect((await fetch(`http://127.0.0.1:${apiPort}/readyz`)).status).toBe(200);
    expect(JSON.parse(await readFile(join(l.root, 'host.json'), 'utf8'))).toMatchObject({ unitName: 'dstack.gateway', unitDir: l.unitDir });

    // dstack's server registers a service through its API (over its tunnel, to 127.0.0.1:8000 on a real host).
    const domain = 'svc-2.gw.example.test';
    const res = await fetch(`http://127.0.0.1:${apiPort}${dstackPaths.registerService('main')}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(
        registerServicePayload({
          runName: 'svc-2',
          domain,
          https: false,
          auth: false,
          model: null,
          sshPrivateKey: dstackProjectKey().privateKey,
        }),
      ),
    });
    expect(res.status, await res.clone().text()).toBe(200);
    // The system Nginx serves it (no replica yet: 503), and the kept default site still answers the rest.
    const served = await eventually(async () => {
      const r = await get(l.httpPort, domain).catch(() => undefined);
      return r?.status === 503 ? r : undefined;
    }, 30_000);
    expect(served.status).toBe(503);
    expect(await readdir(join(l.sitesDir, 'sites'))).toContain(`${domain}.conf`);
    expect((await get(l.defaultPort, 'unknown.example')).body).toContain('Welcome to nginx!');

    // dstack's https service, registered again by the server's sync: served with the
    // certificate dstack's certbot left in the letsencrypt dir, without an ACME request.
    const tls = await fetch(`http://127.0.0.1:${apiPort}${dstackPaths.registerService('main')}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(
        registerServicePayload({
          runName: 'svc-1',
          domain: l.domain,
          https: true,
          auth: false,
          model: null,
          sshPrivateKey: dstackProjectKey().privateKey,
        }),
      ),
    });
    expect(tls.status, await tls.clone().text()).toBe(200);
    const kept = new X509Certificate(await readFile(join(l.letsencrypt, 'archive', l.domain, 'cert1.pem'))).fingerprint256;
    const presented = await eventually(async () => {
      const fp = await peerFingerprint(l.httpsPort, l.domain).catch(() => undefined);
      return fp === kept ? fp : undefined;
    }, 30_000);
    expect(presented).toBe(kept);
    await expect(readFile(certbotCalls, 'utf8')).rejects.toThrow(/ENOENT/);

    // A second adopt changes nothing and leaves the same gateway running.
    const pid = await listenerPid(apiPort);
    const second = await adopt();
    expect(second.exitCode, `${second.stdout}\n${second.stderr}`).toBe(0);
    expect(second.stdout).toContain('nothing to change: already adopted');
    expect(await listenerPid(apiPort)).toBe(pid);
  }, 600_000);
});

/** The pid listening on 127.0.0.1:port, from the kernel's socket table. */
async function listenerPid(port: number): Promise<number | undefined> {
  const r = await execa('ss', ['-Htlnp', `sport = :${port}`], { reject: false });
  const m = /pid=(\d+)/.exec(String(r.stdout));
  return m ? Number(m[1]) : undefined;
}

/** The SHA-256 fingerprint of the certificate 127.0.0.1:port presents for `servername`. */
function peerFingerprint(port: number, servername: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host: '127.0.0.1', port, servername, rejectUnauthorized: false }, () => {
      const fp = socket.getPeerCertificate().fingerprint256;
      socket.destroy();
      resolve(fp);
    });
    socket.on('error', reject);
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
