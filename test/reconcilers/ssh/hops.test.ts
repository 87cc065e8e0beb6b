// Through the balancer socket to an HTTP server behind real sshd: a direct hop, one jump host,
// a head proxy + jump host, a `direct` replica; 503 JSON with no Ready replica; an identical
// PUT or a resync opens no SSH connection.

import type { Server } from 'node:http';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../../helpers/http.js';
import { freePorts } from '../../helpers/ports.js';
import { startSshdChain, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

const SK = 'main/app';
let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let sshds: TestSshd[];
let stopSshds: () => Promise<void>;
let echoes: Server[];
let appPorts: number[];
let h: Harness;

const hop = (s: TestSshd): { host: string; port: number; user: string } => ({ host: '127.0.0.1', port: s.port, user: s.user });

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-hops-');
  ({ key, sshds, stop: stopSshds } = await startSshdChain(tmp.dir, 3));
  appPorts = await freePorts(2);
  echoes = await Promise.all(appPorts.map((p, i) => startEcho(`app${i}`, { port: p })));
});

afterAll(async () => {
  await h?.close();
  await stopSshds?.();
  await Promise.all((echoes ?? []).map(close));
  tmp?.cleanup();
});

describe('hop chains through the balancer socket', () => {
  it('serves a direct SSH hop', async () => {
    const [s0] = sshds as [TestSshd];
    h = await startHarness(specOf(key.privateKey, { app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }] }));
    await h.waitReason(SK, 'r1', 'Connected');
    const r = await h.get(SK);
    expect(r.status).toBe(200);
    expect(echoName(r)).toBe('app0');
    // Only root (and the owner) may connect: no group/other bits without socketGid.
    expect(statSync(h.loop.balancer.socketPathFor(SK)).mode & 0o777).toBe(0o600);
  });

  it('serves through one jump host and through a head proxy + jump host', async () => {
    const [s0, s1, s2] = sshds as [TestSshd, TestSshd, TestSshd];
    const before = sshds.map((s) => s.accepted());
    await h.put(
      specOf(key.privateKey, {
        app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }],
        jump: [{ id: 'j1', appPort: appPorts[0]!, ssh: hop(s1), sshProxy: { ...hop(s0), privateKey: key.privateKey } }],
        chain: [{ id: 'c1', appPort: appPorts[1]!, ssh: hop(s2), sshProxy: hop(s1), sshHeadProxy: hop(s0) }],
      }),
    );
    await h.waitReason('main/jump', 'j1', 'Connected');
    await h.waitReason('main/chain', 'c1', 'Connected');
    expect(echoName(await h.get('main/jump'))).toBe('app0');
    expect(echoName(await h.get('main/chain'))).toBe('app1');
    // s0 saw two new logins (jump + head), s1 two (destination of jump, proxy of chain), s2 one.
    expect(sshds.map((s, i) => s.accepted() - before[i]!)).toEqual([2, 2, 1]);
  });

  it('sends `direct` replicas over plain TCP through the same socket', async () => {
    const [s0] = sshds as [TestSshd];
    await h.put(
      specOf(key.privateKey, {
        app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }],
        plain: [{ id: 'd1', appPort: appPorts[1]!, direct: { host: '127.0.0.1', port: appPorts[1]! } }],
      }),
    );
    expect(h.ready('main/plain', 'd1')?.status).toBe('True');
    expect(echoName(await h.get('main/plain'))).toBe('app1');
  });

  it('an identical PUT and a resync open no SSH connection and touch nothing', async () => {
    const [s0] = sshds as [TestSshd];
    const spec = specOf(key.privateKey, {
      app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }],
      plain: [{ id: 'd1', appPort: appPorts[1]!, direct: { host: '127.0.0.1', port: appPorts[1]! } }],
    });
    const accepted = sshds.map((s) => s.accepted());
    const reconnects = h.reconnects(SK, 'r1'); // r1 is the one SSH replica
    const since = h.ready(SK, 'r1')?.lastTransitionTime;
    await h.put(structuredClone(spec));
    await h.resync();
    await h.put(structuredClone(spec));
    expect(sshds.map((s) => s.accepted())).toEqual(accepted);
    expect(h.reconnects(SK, 'r1')).toBe(reconnects);
    expect(h.ready(SK, 'r1')?.lastTransitionTime).toEqual(since);
    expect(h.controller.counters().ssh?.actionsApplied).toBeGreaterThan(0);
    const plan = await h.controller.dryRun(spec);
    expect(plan.ssh).toEqual([]);
  });

  it('answers 503 JSON, not 502, when no replica is Ready; a removed service loses its socket', async () => {
    const [s0] = sshds as [TestSshd];
    await h.put(
      specOf(key.privateKey, {
        app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }],
        empty: [],
        down: [{ id: 'x1', appPort: appPorts[0]!, ssh: { host: '127.0.0.1', port: 1, user: s0.user } }],
      }),
    );
    for (const sk of ['main/empty', 'main/down']) {
      const r = await h.get(sk);
      expect(r.status).toBe(503);
      expect(r.headers['content-type']).toBe('application/json');
      expect(JSON.parse(r.body)).toEqual({ detail: `Service ${sk} has no ready replica` });
    }
    const path = h.loop.balancer.socketPathFor('main/empty');
    await h.put(specOf(key.privateKey, { app: [{ id: 'r1', appPort: appPorts[0]!, ssh: hop(s0) }] }));
    expect(() => statSync(path)).toThrow();
    expect(h.loop.balancer.listening()).toEqual([SK]);
  });

  it('puts sockets under <stateDir>/sockets', () => {
    expect(h.loop.balancer.socketPathFor(SK).includes(join('sockets', 'main.app.'))).toBe(true);
  });
});
