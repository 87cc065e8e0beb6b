// Rotation against real sshd: a host that stops answering leaves rotation within
// keepalive × count while a healthy replica serves every request; a restarted sshd comes back;
// an added replica receives connections; a removed one receives none.

import type { Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../../helpers/http.js';
import { eventually } from '../../helpers/nginx.js';
import { freePorts } from '../../helpers/ports.js';
import { startSshdChain, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';
import type { Replica } from '../../../src/spec/types.js';

const SK = 'main/app';
const KEEPALIVE_MS = 300;
const KEEPALIVE_COUNT = 3;
let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let a: TestSshd;
let b: TestSshd;
let stopSshds: () => Promise<void>;
let echoes: Server[];
let ports: number[];
let h: Harness;

const replica = (id: string, s: TestSshd, app: number): Replica => ({
  id,
  appPort: ports[app]!,
  ssh: { host: '127.0.0.1', port: s.port, user: s.user },
});

async function names(n: number): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = await h.get(SK);
    expect(r.status).toBe(200);
    out.push(echoName(r));
  }
  return out;
}

/** One HTTP/1.1 request over a raw stream; the echo name of the reply. */
function rawGet(s: Duplex): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = '';
    s.on('data', (d: Buffer) => {
      buf += d.toString();
      const m = /"name":"(app\d)"/.exec(buf);
      if (m) resolve(m[1]!);
    });
    s.once('error', reject);
    s.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  });
}

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-rot-');
  const chain = await startSshdChain(tmp.dir, 2);
  key = chain.key;
  [a, b] = chain.sshds as [TestSshd, TestSshd];
  stopSshds = chain.stop;
  ports = await freePorts(3);
  echoes = await Promise.all(ports.map((p, i) => startEcho(`app${i}`, { port: p })));
  h = await startHarness(specOf(key.privateKey, { app: [replica('ra', a, 0), replica('rb', b, 1)] }), {
    keepaliveIntervalMs: KEEPALIVE_MS,
    keepaliveCountMax: KEEPALIVE_COUNT,
    drainMs: 60_000, // a drain that ends in time ended because its connections closed
  });
  await h.waitReason(SK, 'ra', 'Connected');
  await h.waitReason(SK, 'rb', 'Connected');
});

afterAll(async () => {
  a?.resume();
  await h?.close();
  await stopSshds?.();
  await Promise.all((echoes ?? []).map(close));
  tmp?.cleanup();
});

describe('rotation', () => {
  it('spreads connections over both Ready replicas', async () => {
    expect(new Set(await names(40))).toEqual(new Set(['app0', 'app1']));
  });

  it('a host that stops answering leaves rotation within keepalive × count; requests keep succeeding', async () => {
    a.pause();
    const t0 = Date.now();
    let out = false;
    const seen: string[] = [];
    const traffic = (async () => {
      while (!out) seen.push(...(await names(1))); // every request must be 200
    })();
    await h.waitReason(SK, 'ra', 'ConnectFailed', KEEPALIVE_MS * (KEEPALIVE_COUNT + 1) + 5_000);
    const elapsed = Date.now() - t0;
    out = true;
    await traffic;
    expect(seen.length).toBeGreaterThan(0);
    expect(elapsed).toBeLessThan(KEEPALIVE_MS * (KEEPALIVE_COUNT + 1) + 5_000);
    expect(new Set(await names(10))).toEqual(new Set(['app1']));
  });

  it('a restarted sshd is Ready again after its backoff', async () => {
    await a.restart();
    await h.waitReason(SK, 'ra', 'Connected');
    expect(h.reconnects(SK, 'ra')).toBeGreaterThanOrEqual(1);
    const reconnects = await h.loop
      .metrics()
      .find((f) => f.name === 'tunnel_reconnects_total')!
      .read();
    expect(reconnects.find(([l]) => l.replica === 'ra')?.[1]).toBe(h.reconnects(SK, 'ra'));
    expect(new Set(await names(40))).toEqual(new Set(['app0', 'app1']));
  });

  it('an added replica receives connections, without reconnecting the others', async () => {
    const reconnects = ['ra', 'rb'].map((id) => h.reconnects(SK, id));
    await h.put(specOf(key.privateKey, { app: [replica('ra', a, 0), replica('rb', b, 1), replica('rc', b, 2)] }));
    await h.waitReason(SK, 'rc', 'Connected');
    expect(new Set(await names(60))).toEqual(new Set(['app0', 'app1', 'app2']));
    // One login in all: rc's first; ra and rb did not log in again.
    expect(['ra', 'rb', 'rc'].map((id) => h.reconnects(SK, id))).toEqual([...reconnects, 0]);
  });

  it('a removed replica receives no new connection; its open ones keep working until they close', async () => {
    // Least connections: three in-process connections land on three different replicas.
    await eventually(() => (['ra', 'rb', 'rc'].every((id) => h.loop.activeConnections(id) === 0) ? true : undefined));
    const streams = await Promise.all([0, 1, 2].map(() => h.loop.replicas.open(SK)));
    expect(['ra', 'rb', 'rc'].map((id) => h.loop.activeConnections(id))).toEqual([1, 1, 1]);
    await h.put(specOf(key.privateKey, { app: [replica('ra', a, 0), replica('rb', b, 1)] }));
    expect(h.conditions(SK, 'rc')).toBeUndefined();
    expect((await names(40)).includes('app2')).toBe(false);
    expect(h.loop.stats.draining).toBe(1);
    const served = await Promise.all(streams.map((s) => rawGet(s)));
    expect(served.sort()).toEqual(['app0', 'app1', 'app2']);
    for (const s of streams) s.destroy();
    const until = Date.now() + 10_000;
    while (h.loop.stats.draining > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(h.loop.stats.draining).toBe(0);
    expect(h.replicaKeys()).toEqual([`${SK}/ra`, `${SK}/rb`]);
    // Connections of names() close asynchronously (the channel's CLOSE is a round trip to sshd).
    await eventually(() => (h.loop.activeConnections('ra') + h.loop.activeConnections('rb') === 0 ? true : undefined));
  });
});
