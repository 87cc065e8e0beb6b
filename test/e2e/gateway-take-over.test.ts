// A gateway taking over from the one running on the same state dir (`gateway --take-over true`),
// both real processes (dist/src/cli.js) over the operator's Nginx (system mode, daemonised, its
// own master): the new one converges beside the old, points Nginx's data-plane socket at itself,
// tells the old one to stop, and listens on its API port. A steady client through Nginx to a
// direct replica, to one behind a real sshd (the new process has its own tunnels up before it
// is served), to an `auth: true` service (the token check goes to the data plane, not to the
// API port that changes hands) and to the model API's entrypoint (through the data plane too)
// gets every answer, and a stream open on the old process runs to its end while the old one
// drains.

import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { chmod, mkdtemp, readlink, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeMainConf } from '../../src/reconcilers/nginx/nginx-process.js';
import { CLI } from '../helpers/cli.js';
import { startCliGateway, type CliGateway, type CliGatewayPorts } from '../helpers/cli-gateway.js';
import { api } from '../helpers/gateway.js';
import { request } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { directReplica, integrationDoc, type ServiceDoc, startControlServer, type ControlServer } from './integration-harness.js';

/**
 * A direct replica, one behind sshd, one whose token the control server checks, and the model
 * API's entrypoint (the data plane gives its connections to the API's server).
 */
const HOSTS = ['svc.gw.test', 'tunnel.gw.test', 'guarded.gw.test', 'models.gw.test'];
/** What the steady client asks each host for. */
const pathOf = (host: string): string => (host === 'models.gw.test' ? '/models' : '/');

/** Events the stream sends, one every STREAM_EVERY_MS: it outlives the hand-over, not the drain. */
const STREAM_EVENTS = 20;
const STREAM_EVERY_MS = 100;

let dir: string;
let confPath: string;
let replica: Server;
let replicaPort: number;
let ports: CliGatewayPorts;
let key: ClientKey;
let sshd: TestSshd;
/** dstack's server, for the token check of the `auth: true` service. */
let control: ControlServer;
const TOKEN = 'member-token-0123456789';
const gateways: CliGateway[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'dp-takeover-'));
  // The Nginx workers (www-data) enter the worker dir under it.
  await chmod(dir, 0o711);
  // Workers as root: they connect to the gateway's root-owned data-plane socket.
  const paths = await writeMainConf(join(dir, 'nginx'), { user: 'root', workerProcesses: 2 });
  confPath = paths.confPath;
  const start = await execa('/usr/sbin/nginx', ['-p', join(dir, 'nginx'), '-c', confPath], { reject: false });
  expect(start.exitCode, start.stderr).toBe(0);
  replica = createServer((req, res) => {
    if (req.url !== '/stream') return void res.end(`ok ${process.pid}`);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    let n = 0;
    const timer = setInterval(() => {
      res.write(`data: ${++n}\n\n`);
      if (n === STREAM_EVENTS) {
        clearInterval(timer);
        res.end();
      }
    }, STREAM_EVERY_MS);
    res.on('close', () => clearInterval(timer));
  });
  // An upgraded connection: 101, then every byte echoed back.
  replica.on('upgrade', (_req, socket: Socket) => {
    socket.on('error', () => socket.destroy());
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    socket.pipe(socket);
  });
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  replicaPort = (replica.address() as { port: number }).port;
  const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
  ports = { apiPort, httpPort, httpsPort };
  key = generateKey(join(dir, 'project_ed25519'));
  sshd = await startSshd({ dir: join(dir, 'sshd'), authorizedKeys: [key.publicKey] });
  control = await startControlServer({ main: [TOKEN] });
}, 30_000);

afterAll(async () => {
  for (const g of gateways) await g.kill();
  await sshd?.stop();
  await control?.close();
  await execa('/usr/sbin/nginx', ['-s', 'stop', '-p', join(dir, 'nginx'), '-c', confPath], { reject: false });
  replica?.closeAllConnections();
  await new Promise((r) => replica?.close(r));
  await rm(dir, { recursive: true, force: true });
});

/** The drain period the gateways get: an upgraded connection holds the old one this long. */
const DRAIN_S = 4;
/** How long a gateway told to stop waits for a successor, in the restart test. */
const SUCCESSOR_WAIT_S = 30;

function gatewayArgs(extra: string[] = []): string[] {
  const prefix = join(dir, 'nginx');
  return [
    '--nginx',
    'system',
    '--sites-dir',
    join(prefix, 'conf.d'),
    '--nginx-conf',
    confPath,
    '--reload-command',
    `/usr/sbin/nginx -s reload -p ${prefix} -c ${confPath}`,
    '--test-command',
    `/usr/sbin/nginx -t -q -p ${prefix}`,
    '--drain-period',
    String(DRAIN_S),
    '--server-url',
    control.url,
    ...extra,
  ];
}

/** The document of these tests; `extra` services after the four the steady client asks. */
function takeOverDoc(extra: ServiceDoc[] = []): Record<string, unknown> {
  return integrationDoc({
    sshPrivateKey: key.privateKey,
    entrypoints: [{ domain: 'models.gw.test' }],
    services: [
      { run: 'svc', domain: 'svc.gw.test', replicas: [directReplica('r0', replicaPort)] },
      { run: 'guarded', domain: 'guarded.gw.test', auth: true, replicas: [directReplica('g0', replicaPort)] },
      {
        run: 'tunnel',
        domain: 'tunnel.gw.test',
        replicas: [{ id: 't0', appPort: replicaPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
      },
      ...extra,
    ],
  });
}

/** The management API asked every 10 ms until stop(): calls refused, and the longest time without an answer. */
function apiPoller(): { stop: () => Promise<{ answered: number; refused: number; longestGapMs: number }> } {
  const seen = { answered: 0, refused: 0, longestGapMs: 0 };
  let polling = true;
  const done = (async () => {
    let last = performance.now();
    while (polling) {
      const r = await api(ports, { path: '/readyz' }).catch(() => null);
      const now = performance.now();
      if (r?.status === 200) {
        seen.answered++;
        seen.longestGapMs = Math.max(seen.longestGapMs, now - last);
        last = now;
      } else seen.refused++;
      await new Promise((res) => setTimeout(res, 10));
    }
  })();
  return {
    stop: async () => {
      polling = false;
      await done;
      return seen;
    },
  };
}

const get = (path = '/', host = 'svc.gw.test') =>
  request({ port: ports.httpPort, host, path, localAddress: '127.0.0.2', headers: { authorization: `Bearer ${TOKEN}` } });

interface Seen {
  answered: number;
  failures: string[];
  longestGapMs: number;
}

/** Requests through Nginx to every host in turn, one after another, until stop(). */
function steadyClient(): { seen: Seen; stop: () => Promise<Seen> } {
  const seen: Seen = { answered: 0, failures: [], longestGapMs: 0 };
  let steady = true;
  const done = (async () => {
    let last = performance.now();
    let n = 0;
    while (steady) {
      const host = HOSTS[n++ % HOSTS.length]!;
      const r = await get(pathOf(host), host).catch((err: unknown) => ({ status: 0, body: String(err) }));
      const now = performance.now();
      if (r.status === 200) {
        seen.answered++;
        seen.longestGapMs = Math.max(seen.longestGapMs, now - last);
        last = now;
      } else seen.failures.push(`${host} ${r.status} ${r.body.slice(0, 200)}`);
      await new Promise((res) => setTimeout(res, 5));
    }
  })();
  return {
    seen,
    stop: async () => {
      steady = false;
      await done;
      return seen;
    },
  };
}

/** A stream through Nginx: resolves with its events once it ends, or rejects if it breaks. */
function stream(): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const c = spawn('curl', [
      '-sS',
      '-N',
      '--fail',
      '--interface',
      '127.0.0.2',
      '-H',
      'Host: svc.gw.test',
      `http://127.0.0.1:${ports.httpPort}/stream`,
    ]);
    let out = '';
    let err = '';
    c.stdout.on('data', (d: Buffer) => (out += d.toString()));
    c.stderr.on('data', (d: Buffer) => (err += d.toString()));
    c.once('exit', (code) =>
      code === 0 ? resolve(out.split('\n').filter((l) => l.startsWith('data: '))) : reject(new Error(`curl ${code}: ${err}`)),
    );
  });
}

describe('gateway --take-over true', () => {
  it('takes over from the running gateway: no request fails, an open stream runs to its end', async () => {
    const a = await startCliGateway(join(dir, 'state'), ports, { args: gatewayArgs() });
    gateways.push(a);
    const put = await api(ports, { method: 'PUT', path: '/api/v1/state', body: takeOverDoc() });
    expect(put.status).toBe(200);
    await eventually(async () => {
      for (const host of HOSTS) if ((await get(pathOf(host), host)).status !== 200) return undefined;
      return true;
    }, 20_000);
    const link = join(dir, 'state-nginx', 'sockets', 'dataplane.sock');
    expect(await readlink(link)).toMatch(new RegExp(`^instances/${a.child.pid}\\.`));

    // A steady client through Nginx for the whole hand-over, and a stream opened on the old process.
    const client = steadyClient();
    const events = stream();
    events.catch(() => undefined); // awaited below
    await new Promise((res) => setTimeout(res, 300));

    // Without --take-over a second gateway is refused before it touches anything.
    const refused = await execa(
      process.execPath,
      [
        CLI,
        'gateway',
        '--state-dir',
        join(dir, 'state'),
        '--api-port',
        String(ports.apiPort),
        '--http-port',
        String(ports.httpPort),
        '--https-port',
        String(ports.httpsPort),
        '--listen-host',
        '127.0.0.1',
        ...gatewayArgs(),
      ],
      { reject: false },
    );
    expect(refused.exitCode).toBe(1);
    expect(refused.stderr).toContain(`another gateway (pid ${a.child.pid}) serves`);

    // Its /readyz would be the old one's until it has the API port: it is watched by its link.
    const b = await startCliGateway(join(dir, 'state'), ports, { args: gatewayArgs(['--take-over', 'true']), waitReady: false });
    gateways.push(b);
    await eventually(async () => {
      if (b.child.exitCode !== null) throw new Error(`the new gateway exited ${b.child.exitCode}: ${b.stderr()}`);
      return (await readlink(link)).startsWith(`instances/${b.child.pid}.`) ? true : undefined;
    }, 60_000);
    // The old one ends on its own once what Nginx still sent it has finished.
    const code = await new Promise<number | null>((res) =>
      a.child.exitCode !== null ? res(a.child.exitCode) : a.child.once('exit', (c) => res(c)),
    );
    expect(code).toBe(0);
    expect(await events).toHaveLength(STREAM_EVENTS);
    await new Promise((res) => setTimeout(res, 500));
    const { failures, answered, longestGapMs } = await client.stop();
    expect(failures).toEqual([]);
    expect(answered).toBeGreaterThan(50);
    // The new one serves the API and the document.
    await eventually(async () => ((await api(ports, { path: '/readyz' }).catch(() => null))?.status === 200 ? true : undefined), 30_000);
    expect((await api(ports, { path: '/api/v1/state' })).status).toBe(200);
    expect(b.child.exitCode).toBeNull();
    console.log(`take-over: ${answered} answers, none failed, longest gap ${longestGapMs.toFixed(0)} ms`);
  }, 120_000);

  it('keeps an upgraded connection open on the old process until its drain period ends', async () => {
    const current = gateways.at(-1)!;
    const link = join(dir, 'state-nginx', 'sockets', 'dataplane.sock');
    expect(await readlink(link)).toMatch(new RegExp(`^instances/${current.child.pid}\\.`));
    // An upgraded connection through Nginx to the replica, on the serving gateway.
    const ws = connect({ host: '127.0.0.1', port: ports.httpPort, localAddress: '127.0.0.2' });
    let got = '';
    let closedAt = 0;
    ws.on('data', (d: Buffer) => (got += d.toString('latin1')));
    ws.on('error', () => undefined);
    ws.once('close', () => (closedAt = performance.now()));
    ws.write('GET /ws HTTP/1.1\r\nHost: svc.gw.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    await eventually(() => (got.includes('\r\n\r\n') ? true : undefined), 10_000);
    expect(got).toMatch(/^HTTP\/1\.1 101 /);

    // The next test restarts this one: told to stop, it serves until a successor takes over.
    const next = await startCliGateway(join(dir, 'state'), ports, {
      args: gatewayArgs(['--take-over', 'true', '--successor-wait', String(SUCCESSOR_WAIT_S)]),
      waitReady: false,
    });
    gateways.push(next);
    await eventually(async () => ((await readlink(link)).startsWith(`instances/${next.child.pid}.`) ? true : undefined), 60_000);
    const switched = performance.now();
    // Still through the old process: it echoes.
    got = '';
    ws.write('still there');
    await eventually(() => (got === 'still there' ? true : undefined), 5_000);
    const code = await new Promise<number | null>((res) =>
      current.child.exitCode !== null ? res(current.child.exitCode) : current.child.once('exit', (c) => res(c)),
    );
    expect(code).toBe(0);
    await eventually(() => (closedAt > 0 ? true : undefined), 5_000);
    // Cut when the drain period ended, not before (a little slack for the signal's way).
    expect(closedAt - switched).toBeGreaterThan(DRAIN_S * 1000 - 500);
    expect((await get()).status).toBe(200);
  }, 60_000);

  it('restarts without a dropped request: told to stop first, the old one serves until the new one takes over', async () => {
    const current = gateways.at(-1)!;
    const link = join(dir, 'state-nginx', 'sockets', 'dataplane.sock');
    expect(await readlink(link)).toMatch(new RegExp(`^instances/${current.child.pid}\\.`));
    const client = steadyClient();
    const events = stream();
    events.catch(() => undefined); // awaited below
    await new Promise((res) => setTimeout(res, 300));

    // A restart as systemd does one: stop, and only once that returned, start.
    const management = apiPoller();
    current.child.kill('SIGTERM');
    await new Promise((res) => setTimeout(res, 1_500));
    // It serves on whole until a successor comes: its data plane, and its management API too.
    expect(current.child.exitCode).toBeNull();
    expect(await readlink(link)).toMatch(new RegExp(`^instances/${current.child.pid}\\.`));
    const before = client.seen.answered;
    expect(client.seen.failures).toEqual([]);
    await new Promise((res) => setTimeout(res, 300));
    expect(client.seen.answered).toBeGreaterThan(before);
    // A change sent to it now is stored, and the gateway that takes over serves it.
    const late = await api(ports, {
      method: 'PUT',
      path: '/api/v1/state',
      body: takeOverDoc([{ run: 'late', domain: 'late.gw.test', replicas: [directReplica('l0', replicaPort)] }]),
    });
    expect(late.status, late.body).toBe(200);

    const next = await startCliGateway(join(dir, 'state'), ports, { args: gatewayArgs(['--take-over', 'true']), waitReady: false });
    gateways.push(next);
    await eventually(async () => {
      if (next.child.exitCode !== null) throw new Error(`the new gateway exited ${next.child.exitCode}: ${next.stderr()}`);
      return (await readlink(link)).startsWith(`instances/${next.child.pid}.`) ? true : undefined;
    }, 60_000);
    // A second SIGTERM (the take-over's) does not cut the old one's drain short.
    const code = await new Promise<number | null>((res) =>
      current.child.exitCode !== null ? res(current.child.exitCode) : current.child.once('exit', (c) => res(c)),
    );
    expect(code).toBe(0);
    expect(await events).toHaveLength(STREAM_EVENTS);
    await new Promise((res) => setTimeout(res, 500));
    const { failures, answered } = await client.stop();
    expect(failures).toEqual([]);
    expect(answered).toBeGreaterThan(50);
    await eventually(async () => ((await api(ports, { path: '/readyz' }).catch(() => null))?.status === 200 ? true : undefined), 30_000);
    const calls = await management.stop();
    // The API's port changes hands once the new one has taken over: only then, and briefly.
    console.log(
      `restart: management API answered ${calls.answered} calls, refused ${calls.refused}, longest time without an answer ${calls.longestGapMs.toFixed(0)} ms`,
    );
    expect(calls.answered).toBeGreaterThan(50);
    expect((await get('/', 'late.gw.test')).status).toBe(200);
  }, 120_000);
});
