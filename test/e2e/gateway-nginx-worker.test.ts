// The private Nginx's workers run as an unprivileged user (www-data by default) while the tests
// run as root, and every path they open themselves still works: a site through its balancer
// socket, an ACME challenge from the webroot, the access log, and an upload larger than
// client_body_buffer_size (buffered to a temp file). The state dir stays 0700.

import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { readFile, readdir, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { call, directReplica, integrationDoc, startGatewayWith } from './integration-harness.js';

const asRoot = process.getuid?.() === 0;
const SITE = 'upload.gw.test';

let t: TestGateway;
let backend: Server;
let www: { uid: number; gid: number };
const bodies: number[] = [];

/** PIDs whose parent is `pid`, and the real/effective uid of each. */
async function childUids(pid: number): Promise<{ pid: number; uids: number[] }[]> {
  const out: { pid: number; uids: number[] }[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const status = await readFile(`/proc/${name}/status`, 'utf8').catch(() => '');
    if (!new RegExp(`^PPid:\\s+${pid}$`, 'm').test(status)) continue;
    const uids = /^Uid:\s+(.*)$/m.exec(status)![1]!.trim().split(/\s+/).map(Number);
    out.push({ pid: Number(name), uids });
  }
  return out;
}

beforeAll(async () => {
  if (!asRoot) return;
  www = { uid: Number((await execa('id', ['-u', 'www-data'])).stdout), gid: Number((await execa('id', ['-g', 'www-data'])).stdout) };
  const [port] = (await freePorts(1)) as [number];
  // Counts the bytes of each request body it receives.
  backend = createServer((req, res) => {
    let n = 0;
    req.on('data', (c: Buffer) => (n += c.length));
    req.on('end', () => {
      bodies.push(n);
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ received: n }));
    });
  });
  await new Promise<void>((r) => backend.listen(port, '127.0.0.1', r));
  t = await startGatewayWith();
  const doc = integrationDoc({ services: [{ run: 'upload', domain: SITE, replicas: [directReplica('upload-r0', port)] }] });
  expect((await putState(t, doc)).status).toBe(200);
  await eventually(async () => ((await call({ port: t.httpPort, host: SITE })).status === 200 ? true : undefined), 30_000);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  if (backend) await close(backend);
});

describe.runIf(asRoot)('Nginx workers as www-data', () => {
  it('runs every worker as www-data, the master as root', async () => {
    const master = t.gw.nginx!.pid!;
    const workers = await childUids(master);
    expect(workers.length).toBeGreaterThanOrEqual(1);
    for (const w of workers) expect(w.uids, `worker ${w.pid}`).toEqual([www.uid, www.uid, www.uid, www.uid]);
    expect(await readFile(join(t.stateDir, 'nginx', 'nginx.conf'), 'utf8')).toContain('\nuser www-data;\n');
  });

  it("serves a site through the data plane's shared socket, which only the gateway and www-data can open", async () => {
    const r = await call({ port: t.httpPort, host: SITE, path: '/hello', localAddress: '127.0.0.2' });
    expect(r.status).toBe(200);
    const sock = t.gw.ssh.balancer.socketPathFor('main/upload');
    expect(sock).toBe(t.gw.ssh.balancer.sharedSocketPath);
    const st = await stat(sock);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);
    expect(st.gid).toBe(www.gid);
    const dir = await stat(join(sock, '..'));
    expect(dir.mode & 0o777).toBe(0o710);
    expect(dir.gid).toBe(www.gid);
  });

  it('serves an ACME challenge from the webroot', async () => {
    const file = join(t.gw.paths.acmeWebroot, '.well-known', 'acme-challenge', 'tok-www');
    await writeFile(file, 'challenge-for-www-data', { mode: 0o644 });
    for (const host of [SITE, 'no-site-yet.gw.test']) {
      const r = await call({ port: t.httpPort, host, path: '/.well-known/acme-challenge/tok-www' });
      expect(r).toMatchObject({ status: 200, body: 'challenge-for-www-data' });
    }
  });

  it('writes the access log', async () => {
    const marker = `/logged-${Date.now()}`;
    expect((await call({ port: t.httpPort, host: SITE, path: marker })).status).toBe(200);
    const log = await eventually(async () => {
      const text = await readFile(t.gw.paths.accessLog, 'utf8').catch(() => '');
      return text.split('\n').some((l) => l.includes(` ${SITE} 200 `)) ? text : undefined;
    });
    expect(log).toMatch(new RegExp(` ${SITE.replace(/\./g, '\\.')} 200 \\S+ 1$`, 'm'));
  });

  it('takes an upload larger than client_body_buffer_size through a temp file', async () => {
    const body = 'x'.repeat(1024 * 1024); // 1 MiB; the buffer is 16 KiB
    const errorLog = join(t.stateDir, 'nginx', 'logs', 'error.log');
    const r = await call({
      port: t.httpPort,
      host: SITE,
      path: '/upload',
      method: 'POST',
      body,
      headers: { 'content-type': 'text/plain' },
    });
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body)).toEqual({ received: body.length });
    // Nginx says when it spooled a body to disk: the temp dir was writable by the worker.
    await eventually(async () =>
      (await readFile(errorLog, 'utf8')).includes('a client request body is buffered to a temporary file') ? true : undefined,
    );
    expect(await readFile(errorLog, 'utf8')).not.toContain('(13: Permission denied)');
  });

  it('keeps the state dir 0700 and its secrets unreadable by the workers', async () => {
    expect((await stat(t.stateDir)).mode & 0o777).toBe(0o700);
    expect((await stat(join(t.stateDir, 'nginx-internal'))).mode & 0o777).toBe(0o700);
  });
});

describe.runIf(asRoot)('refused worker setups', () => {
  async function startIn(parent: string, flags: Record<string, string> = {}): Promise<unknown> {
    const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
    const options = resolveOptions({
      flags: {
        stateDir: join(parent, 'state'),
        apiPort: String(apiPort),
        httpPort: String(httpPort),
        httpsPort: String(httpsPort),
        listenHost: '127.0.0.1',
        logLevel: 'silent',
        ...flags,
      },
    });
    return startGateway(options).then(
      async (gw) => {
        await gw.close();
        return undefined;
      },
      (err: unknown) => err,
    );
  }

  it('says which parent the workers cannot enter, before starting anything', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-closed-')); // 0700, root's
    try {
      const err = await startIn(dir);
      expect(String(err)).toContain(`Nginx workers run as www-data and cannot reach ${join(dir, 'state')}-nginx: ${dir} (mode 0700`);
      expect(String(err)).toContain('--nginx-worker-dir');
      expect(existsSync(join(dir, 'state-nginx'))).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses root and unknown users as --nginx-user', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dp-user-'));
    try {
      expect(String(await startIn(dir, { nginxUser: 'root' }))).toMatch(/--nginx-user root is root/);
      expect(String(await startIn(dir, { nginxUser: 'no-such-user-dp' }))).toMatch(/no such user no-such-user-dp/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
