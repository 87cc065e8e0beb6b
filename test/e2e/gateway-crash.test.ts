// Recovery from crashes, against the real private Nginx: a gateway killed with SIGKILL (its
// master survives with ppid 1 and holds the ports), a master killed with SIGKILL (its workers
// survive and keep serving the old config), and the files an interrupted apply or certbot run
// leaves behind.

import { existsSync } from 'node:fs';
import { mkdir, readFile, readdir, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { startCliGateway, type CliGateway } from '../helpers/cli-gateway.js';
import { api, gatewayDoc, putState, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

/** Running (not exited, not a zombie) per /proc. */
async function alive(pid: number): Promise<boolean> {
  const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return st !== '' && st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3) !== 'Z';
}

async function childrenOf(pid: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    if (st.slice(st.lastIndexOf(')') + 2).split(' ')[1] === String(pid)) out.push(Number(name));
  }
  return out;
}

/** A request from 127.0.0.2, so Nginx does not see a local client. */
const get = (port: number, host: string) => request({ port, host, localAddress: '127.0.0.2' });

let echo: Server;
let echoPort: number;
const tmps: { cleanup: () => void }[] = [];
const children: CliGateway[] = [];

afterAll(async () => {
  for (const c of children) await c.kill();
  await new Promise<void>((r) => (echo ? echo.close(() => r()) : r()));
  for (const t of tmps) t.cleanup();
});

async function echoServer(): Promise<number> {
  if (!echo) {
    [echoPort] = (await freePorts(1)) as [number];
    echo = await startEcho('echo', { port: echoPort });
  }
  return echoPort;
}

async function siteReady(t: { apiPort: number }, domain: string, generation: number): Promise<true | undefined> {
  const s = (await api(t, { path: '/api/v1/status' })).json as {
    loops: Record<string, { objects: Record<string, { conditions: { type: string; status: string; observedGeneration: number }[] }> }>;
  };
  const ready = s.loops.nginx?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
  return ready?.status === 'True' && ready.observedGeneration >= generation ? true : undefined;
}

describe('a gateway killed with SIGKILL', () => {
  it('is taken over by a new gateway on the same state dir: the old private Nginx is stopped and the new one serves', async () => {
    const tmp = tmpDir('dp-crash-');
    tmps.push(tmp);
    const stateDir = join(tmp.dir, 'state');
    const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
    const ports = { apiPort, httpPort, httpsPort };
    const port = await echoServer();

    const first = await startCliGateway(stateDir, ports);
    children.push(first);
    const put = await api(first, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc([{ run: 'pub', ports: [port] }]) });
    expect(put.status).toBe(200);
    const generation = (put.json as { generation: number }).generation;
    await eventually(() => siteReady(first, 'pub.gw.test', generation));
    expect((await get(httpPort, 'pub.gw.test')).status).toBe(200);
    const oldMaster = Number((await readFile(join(stateDir, 'nginx', 'nginx.pid'), 'utf8')).trim());
    const oldWorkers = await childrenOf(oldMaster);

    await first.kill();
    expect(await alive(oldMaster)).toBe(true); // the orphan keeps the ports: what the next start must handle

    const t0 = Date.now();
    const second = await startCliGateway(stateDir, ports);
    children.push(second);
    await eventually(async () => ((await get(httpPort, 'pub.gw.test')).status === 200 ? true : undefined), 20_000);
    // Figure for the report, not an assertion: start of the new process → the site answers.
    console.log(`takeover after SIGKILL of the gateway: served ${Date.now() - t0} ms after the new gateway was started`);
    for (const pid of [oldMaster, ...oldWorkers]) expect(await alive(pid)).toBe(false);
    const newMaster = Number((await readFile(join(stateDir, 'nginx', 'nginx.pid'), 'utf8')).trim());
    expect(newMaster).not.toBe(oldMaster);
    const metrics = (await api(second, { path: '/metrics' })).body;
    expect(metrics).toMatch(new RegExp(`^dstack_proxy_nginx_stale_processes_stopped_total ${1 + oldWorkers.length}$`, 'm'));

    second.child.kill('SIGTERM');
    await new Promise((r) => second.child.once('exit', r));
    expect(await alive(newMaster)).toBe(false);
  });
});

describe('a private Nginx master killed with SIGKILL', () => {
  let t: TestGateway | undefined;
  afterEach(async () => {
    await t?.cleanup();
    t = undefined;
  });

  it('stops the orphaned workers, restarts, applies the change made meanwhile (auth false → true), and reports it', async () => {
    const port = await echoServer();
    t = await startTestGateway();
    expect((await putState(t, gatewayDoc([{ run: 'pub', ports: [port] }]))).status).toBe(200);
    expect((await get(t.httpPort, 'pub.gw.test')).status).toBe(200);
    const master = t.gw.nginx!.pid!;
    const workers = await childrenOf(master);
    expect(workers.length).toBeGreaterThan(0);

    const t0 = Date.now();
    process.kill(master, 'SIGKILL');
    const put = await putState(t, gatewayDoc([{ run: 'pub', auth: true, ports: [port] }]));
    expect(put.status).toBe(200);
    await eventually(async () => ((await get(t!.httpPort, 'pub.gw.test')).status === 401 ? true : undefined));
    // Figure for the report, not an assertion.
    console.log(`SIGKILL of the master → the new config (auth) served: ${Date.now() - t0} ms`);
    for (const pid of workers) expect(await alive(pid)).toBe(false);
    expect(t.gw.nginx!.pid).not.toBe(master);

    await t.gw.controller.whenIdle();
    const status = (await api(t, { path: '/api/v1/status' })).json as {
      loops: { nginx: { objects: Record<string, { conditions: { type: string; status: string; reason: string; message: string }[] }> } };
    };
    const proc = status.loops.nginx.objects['(nginx)']?.conditions.find((c) => c.type === 'Ready');
    expect(proc).toMatchObject({ status: 'True', reason: 'Restarted' });
    expect(proc!.message).toMatch(/signal SIGKILL/);
    expect(status.loops.nginx.objects['pub.gw.test']?.conditions.find((c) => c.type === 'Ready')).toMatchObject({
      status: 'True',
      reason: 'Applied',
    });
    const metrics = (await api(t, { path: '/metrics' })).body;
    expect(metrics).toMatch(/^dstack_proxy_nginx_restarts_total 1$/m);
    expect(metrics).toMatch(new RegExp(`^dstack_proxy_nginx_stale_processes_stopped_total ${workers.length}$`, 'm'));
  });
});

describe('files a crash left behind', () => {
  it('are removed at start: candidate trees of an interrupted nginx -t, temp site files, certbot EAB files', async () => {
    const tmp = tmpDir('dp-crash-');
    tmps.push(tmp);
    const stateDir = join(tmp.dir, 'state');
    const prefix = join(stateDir, 'nginx');
    const leftovers = [
      join(prefix, '.conf.d.candidate-0badf00d', 'sites', 'a.gw.test.conf'),
      join(prefix, '.dstack-proxy-candidate-0badf00d.conf'),
      join(prefix, 'conf.d', 'sites', '.a.gw.test.conf.1234abcd.tmp'),
      join(prefix, 'conf.d', '.00-dstack-proxy-global.conf.1234abcd.tmp'),
      join(stateDir, 'certbot', 'work', 'eab-4242-1.ini'),
    ];
    const kept = [join(prefix, 'conf.d', 'sites', 'README.txt'), join(stateDir, 'certbot', 'work', 'eab-notes.ini')];
    for (const f of [...leftovers, ...kept]) {
      await mkdir(join(f, '..'), { recursive: true, mode: 0o700 });
      await writeFile(f, 'left behind\n');
    }
    t2 = await startTestGateway({ stateDir });
    for (const f of leftovers) expect(existsSync(f), f).toBe(false);
    expect(existsSync(join(prefix, '.conf.d.candidate-0badf00d'))).toBe(false);
    for (const f of kept) expect(existsSync(f), f).toBe(true);
  });
  let t2: TestGateway | undefined;
  afterAll(async () => {
    await t2?.close();
  });
});
