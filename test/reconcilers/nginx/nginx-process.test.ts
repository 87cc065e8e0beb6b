import { readFile, readdir, unlink, writeFile } from 'node:fs/promises';
import { execa } from 'execa';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  mainConfText,
  NginxProcess,
  parseTestOutput,
  splitCommand,
  systemNginx,
  testConfig,
  type MainConfOptions,
} from '../../../src/reconcilers/nginx/nginx-process.js';
import { renderGlobal } from '../../../src/reconcilers/nginx/render.js';
import { buildViews } from '../../../src/reconcilers/nginx/view.js';
import { request } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { emptyState } from '../../../src/spec/types.js';

describe('mainConfText', () => {
  it('points every path into the state dir and includes the global file before the sites', () => {
    const { text, paths } = mainConfText('/srv/dp', { user: 'nginx-w', workerProcesses: 'auto' });
    expect(paths).toEqual({
      prefix: '/srv/dp',
      confPath: '/srv/dp/nginx.conf',
      confDir: '/srv/dp/conf.d',
      pidPath: '/srv/dp/nginx.pid',
      errorLogPath: '/srv/dp/logs/error.log',
      tempDir: '/srv/dp/tmp',
    });
    const lines = text.split('\n').map((l) => l.trim());
    for (const want of [
      'worker_processes auto;',
      'pid /srv/dp/nginx.pid;',
      'error_log /srv/dp/logs/error.log notice;',
      'user nginx-w;',
      'proxy_temp_path /srv/dp/tmp/proxy;',
      'client_body_temp_path /srv/dp/tmp/body;',
      'server_names_hash_bucket_size 128;',
    ])
      expect(lines).toContain(want);
    expect(lines.indexOf('include /srv/dp/conf.d/*.conf;')).toBeLessThan(lines.indexOf('include /srv/dp/conf.d/sites/*.conf;'));
  });
  it('runs the workers as www-data by default when the master runs as root, never as root', () => {
    const text = mainConfText('/x').text;
    if (process.getuid?.() === 0) expect(text).toContain('\nuser www-data;\n');
    else expect(text).not.toContain('user ');
    expect(text).not.toContain('user root');
  });
  it('puts the temp dirs where told (the workers write there)', () => {
    const { text, paths } = mainConfText('/x', { tempDir: '/w/tmp' });
    expect(paths.tempDir).toBe('/w/tmp');
    expect(text).toContain('client_body_temp_path /w/tmp/body;');
  });
  it('omits user when told, and refuses a bad worker count', () => {
    expect(mainConfText('/x', { user: null }).text).not.toContain('user ');
    expect(() => mainConfText('/x', { workerProcesses: 0 })).toThrow(/workerProcesses/);
  });
});

describe('parseTestOutput', () => {
  it.each([
    [
      'nginx: [emerg] unexpected "}" in /t/ng/sites/bad.conf:1\nnginx: configuration file /t/nginx.conf test failed',
      { message: '[emerg] unexpected "}" in /t/ng/sites/bad.conf:1', file: '/t/ng/sites/bad.conf', line: 1 },
    ],
    [
      '2026/01/01 00:00:00 [emerg] 12#12: unknown directive "x" in /a/b.conf:7',
      { message: '[emerg] unknown directive "x" in /a/b.conf:7', file: '/a/b.conf', line: 7 },
    ],
    ['nginx: [emerg] no "events" section in configuration', { message: '[emerg] no "events" section in configuration' }],
  ])('%s', (out, want) => expect(parseTestOutput(out)).toEqual(want));
});

describe('splitCommand', () => {
  it.each([
    ['nginx -s reload', ['nginx', '-s', 'reload']],
    ['systemctl  reload nginx', ['systemctl', 'reload', 'nginx']],
    [`nginx -g 'daemon off;' -t`, ['nginx', '-g', 'daemon off;', '-t']],
    ['nginx "a b"; rm -rf /', ['nginx', 'a b', ';', 'rm', '-rf', '/']], // no shell: ';' is just an argument
  ])('%s', (cmd, want) => expect(splitCommand(cmd).filter(Boolean)).toEqual(want.filter(Boolean)));
  it('refuses an empty command', () => expect(() => splitCommand('  ')).toThrow());
});

describe('a private Nginx', () => {
  let ng: TestNginx;
  beforeAll(async () => {
    ng = await startTestNginx({ start: false });
    const views = buildViews(emptyState(), {
      httpPort: ng.httpPort,
      httpsPort: ng.httpsPort,
      acmeWebroot: ng.acmeWebroot,
      accessLogPath: ng.accessLogPath,
    });
    await writeFile(join(ng.paths.confDir, views.global.fileName), renderGlobal(views.global));
  });
  afterAll(async () => {
    await ng?.stop();
  });

  it('tests configs and reports the failing file and line', async () => {
    expect(await testConfig(ng.paths.confPath, ng.paths.prefix)).toEqual({ ok: true });
    const bad = join(ng.paths.confDir, 'sites', 'bad.conf');
    await writeFile(bad, 'server {\n  listen 1;\n}\n}\n');
    try {
      expect(await testConfig(ng.paths.confPath, ng.paths.prefix)).toMatchObject({ ok: false, file: bad, line: 4 });
      await expect(ng.proc.start()).rejects.toThrow(/unexpected "}"/);
    } finally {
      await unlink(bad);
    }
  });

  it('starts, serves, reloads and restarts after an unexpected exit', async () => {
    await ng.proc.start();
    const first = ng.proc.pid;
    expect((await request({ port: ng.httpPort, host: 'unknown.test' })).status).toBe(404);
    await ng.proc.reload();
    expect(ng.events.map((e) => e.type)).toEqual(['started', 'reloaded']);

    process.kill(first!, 'SIGTERM'); // not through stop(): a crash as far as the supervisor knows
    await eventually(() => (ng.events.filter((e) => e.type === 'started').length === 2 ? true : undefined));
    expect(ng.events).toContainEqual({ type: 'exited', code: 0, signal: null, expected: false });
    expect(ng.events).toContainEqual({ type: 'restarting', attempt: 1, delayMs: 200 });
    expect(ng.proc.pid).not.toBe(first);
    expect((await request({ port: ng.httpPort, host: 'unknown.test' })).status).toBe(404);
  });

  it('runs system-mode test and reload commands without a shell', async () => {
    const sys = systemNginx({
      testCommand: `/usr/sbin/nginx -t -q -p ${ng.paths.prefix}`,
      reloadCommand: `/usr/sbin/nginx -s reload -p ${ng.paths.prefix} -c ${ng.paths.confPath}`,
    });
    expect(await sys.test(ng.paths.confPath)).toEqual({ ok: true });
    const offset = ng.events.length;
    await sys.reload();
    await expect(systemNginx({ reloadCommand: '/usr/sbin/nginx -s reload -c /nonexistent.conf' }).reload()).rejects.toThrow(/exited 1/);
    expect(ng.events.length).toBe(offset); // a signal from outside is not a restart
  });

  it('stops without restarting', async () => {
    const before = ng.events.length;
    await ng.proc.stop();
    expect(ng.events.slice(before)).toEqual([expect.objectContaining({ type: 'exited', expected: true })]);
    expect(ng.proc.pid).toBeUndefined();
  });
});

// ── leftovers of a killed gateway or master ───────────────────────────────────────────────

/** Running (not exited, not a zombie) per /proc. */
async function alive(pid: number): Promise<boolean> {
  const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return st !== '' && st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3) !== 'Z';
}

async function workersOf(master: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    if (st.slice(st.lastIndexOf(')') + 2).split(' ')[1] === String(master)) out.push(Number(name));
  }
  return out;
}

/** A site on `port` answering `body`, so a test can tell which config serves. */
async function writeSite(ng: TestNginx, body: string): Promise<void> {
  await writeFile(
    join(ng.paths.confDir, 'sites', 'probe.conf'),
    `server { listen 127.0.0.1:${ng.httpPort}; server_name probe.test; return 200 "${body}"; }\n`,
  );
}

describe('a private Nginx after a crash', () => {
  const started: TestNginx[] = [];
  afterAll(async () => {
    for (const ng of started) await ng.stop().catch(() => undefined);
  });
  const fresh = async (main?: MainConfOptions): Promise<TestNginx> => {
    const ng = await startTestNginx({ start: false, ...(main ? { main } : {}) });
    started.push(ng);
    return ng;
  };

  it('stops the previous Nginx of its prefix (a killed gateway left it, with ppid 1) before it binds, and no other', async () => {
    const ng = await fresh({ user: null, workerProcesses: 2 });
    const other = await fresh({ user: null });
    await writeSite(ng, 'old');
    await writeSite(other, 'other');
    await other.proc.start();
    // What a gateway killed with SIGKILL leaves: a daemonised master of the prefix (ppid 1).
    const r = await execa('/usr/sbin/nginx', ['-p', ng.paths.prefix, '-c', ng.paths.confPath], { reject: false });
    expect(r.exitCode).toBe(0);
    const leftover = Number((await readFile(ng.paths.pidPath, 'utf8')).trim());
    // The master writes its pid (sockets bound) before it forks the workers.
    const leftoverWorkers = await eventually(async () => {
      const w = await workersOf(leftover);
      return w.length === 2 ? w : undefined;
    });
    expect((await request({ port: ng.httpPort, host: 'probe.test' })).body).toBe('old');

    await writeSite(ng, 'new');
    await ng.proc.start();
    for (const pid of [leftover, ...leftoverWorkers]) expect(await alive(pid)).toBe(false);
    expect(ng.events.map((e) => e.type)).toEqual(['stale-stopped', 'started']);
    expect(ng.events[0]).toMatchObject({ pids: expect.arrayContaining([leftover, ...leftoverWorkers]) });
    expect(ng.proc.info).toMatchObject({ running: true, staleStopped: 3, restarts: 0 });
    expect((await request({ port: ng.httpPort, host: 'probe.test' })).body).toBe('new');
    // Another prefix's Nginx is left alone.
    expect(await alive(other.proc.pid!)).toBe(true);
    expect((await request({ port: other.httpPort, host: 'probe.test' })).body).toBe('other');
  });

  it('never signals a pid from nginx.pid that is not an Nginx of its prefix (pid reused)', async () => {
    const ng = await fresh({ user: null });
    const sleeper = execa('sleep', ['30'], { reject: false });
    try {
      await writeFile(ng.paths.pidPath, `${sleeper.pid}\n`);
      await ng.proc.start();
      expect(await alive(sleeper.pid!)).toBe(true);
      expect(ng.events.map((e) => e.type)).toEqual(['started']);
    } finally {
      sleeper.kill('SIGKILL');
      await sleeper;
    }
  });

  it('after SIGKILL of the master: stops the orphaned workers, restarts, serves the files as they are now', async () => {
    const ng = await fresh({ user: null, workerProcesses: 2 });
    await writeSite(ng, 'before');
    await ng.proc.start();
    const master = ng.proc.pid!;
    const workers = await eventually(async () => {
      const w = await workersOf(master);
      return w.length === 2 ? w : undefined;
    });
    process.kill(master, 'SIGKILL');
    await writeSite(ng, 'after');
    // A reload asked for while the master is down waits for the restart instead of failing.
    await ng.reload();
    for (const pid of workers) expect(await alive(pid)).toBe(false);
    expect(ng.proc.info).toMatchObject({ running: true, restarts: 1, staleStopped: 2, lastExit: { signal: 'SIGKILL' } });
    expect(ng.proc.pid).not.toBe(master);
    expect(ng.events.map((e) => e.type)).toEqual(['started', 'exited', 'restarting', 'stale-stopped', 'started', 'reloaded']);
    expect((await request({ port: ng.httpPort, host: 'probe.test' })).body).toBe('after');
  });
});

describe('a reload whose previous workers keep accepting', () => {
  it('is reported unconfirmed at the deadline (not failed), and settles once they stop', async () => {
    const ng = await startTestNginx({ start: false, main: { user: null } });
    const proc = new NginxProcess({ paths: ng.paths, timeoutMs: 1_000 });
    try {
      await writeSite(ng, 'one');
      await proc.start();
      const [worker] = await eventually(async () => {
        const w = await workersOf(proc.pid!);
        return w.length === 1 ? w : undefined;
      });
      // A worker that cannot take the master's "shut down" signal keeps its listening sockets.
      process.kill(worker!, 'SIGSTOP');
      await writeSite(ng, 'two');
      const outcome = await proc.reload();
      expect(outcome).toMatchObject({ unconfirmed: expect.stringMatching(new RegExp(`previous one \\(pid ${worker}\\) still accept`)) });
      expect(await outcome!.settled()).toBe(false);
      process.kill(worker!, 'SIGCONT');
      await eventually(async () => ((await outcome!.settled()) ? true : undefined));
      expect((await request({ port: ng.httpPort, host: 'probe.test' })).body).toBe('two');
      expect(await proc.reload()).toBeUndefined();
    } finally {
      await proc.stop();
      await ng.stop();
    }
  });
});
