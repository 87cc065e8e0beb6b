// Replicas reached through identical hops share one SSH connection (real sshd, logins counted
// from its log): one login for several replicas of several services, a connection of its own
// for another key, one login again after the shared connection was lost, the connection kept
// while one holder is left and closed with the last; `shareConnections: false` logs in per
// replica. Host keys stay judged per replica on a shared connection.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../../helpers/http.js';
import { eventually } from '../../helpers/nginx.js';
import { freePort } from '../../helpers/ports.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import type { HostKeyPolicy, ProxyState, Replica } from '../../../src/spec/types.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let other: ClientKey;
let echo: Server;
let appPort: number;
const sshds: TestSshd[] = [];
const harnesses: Harness[] = [];

async function sshd(name: string): Promise<TestSshd> {
  const s = await startSshd({ dir: join(tmp.dir, name), authorizedKeys: [key.publicKey, other.publicKey] });
  sshds.push(s);
  return s;
}
async function harness(state: ProxyState, shareConnections?: boolean): Promise<Harness> {
  const h = await startHarness(state, shareConnections === undefined ? {} : { shareConnections });
  harnesses.push(h);
  return h;
}
const replica = (id: string, s: TestSshd, policy?: HostKeyPolicy): Replica => ({
  id,
  appPort,
  ssh: { host: '127.0.0.1', port: s.port, user: s.user },
  ...(policy ? { hostKeyPolicy: policy } : {}),
});
/** The loop's ssh_connections gauge. */
async function connections(h: Harness): Promise<number> {
  const family = h.loop.metrics().find((m) => m.name === 'ssh_connections');
  return Number((await family?.read())?.[0]?.[1]);
}
/** Replicas a1 and a2 of main/a and b1 of main/b, the three-replica setups below, all Connected. */
async function threeConnected(h: Harness): Promise<void> {
  for (const [sk, id] of [
    ['main/a', 'a1'],
    ['main/a', 'a2'],
    ['main/b', 'b1'],
  ] as const)
    await h.waitReason(sk, id, 'Connected');
}
async function allServe(h: Harness, keys: string[]): Promise<void> {
  for (const sk of keys) expect(echoName(await h.get(sk))).toBe('app');
}

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-shared-');
  key = generateKey(join(tmp.dir, 'client_ed25519'));
  other = generateKey(join(tmp.dir, 'other_ed25519'));
  appPort = await freePort();
  echo = await startEcho('app', { port: appPort });
});

afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.close()));
  await Promise.all(sshds.map((s) => s.stop()));
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('SSH connections shared by replicas behind identical hops', () => {
  it('one login serves replicas of several services; lost, it comes back as one; it ends with its last holder', async () => {
    const s = await sshd('shared');
    const h = await harness(specOf(key.privateKey, { a: [replica('a1', s), replica('a2', s)], b: [replica('b1', s)] }));
    await threeConnected(h);
    expect(s.accepted()).toBe(1);
    expect(await connections(h)).toBe(1);
    await allServe(h, ['main/a', 'main/a', 'main/b']);

    // Lost: every holder hears of it, and the first to reconnect opens the one they all join.
    await s.kill();
    await eventually(() => h.ready('main/b', 'b1')?.status === 'False' || undefined);
    await s.restart();
    await threeConnected(h);
    expect(s.accepted()).toBe(2);
    expect(h.reconnects('main/b', 'b1')).toBe(1);
    await allServe(h, ['main/a', 'main/b']);

    // Kept while a holder is left; closed with the last.
    await h.put(specOf(key.privateKey, { b: [replica('b1', s)] }));
    await eventually(() => h.ready('main/a', 'a1') === undefined || undefined);
    await allServe(h, ['main/b']);
    expect(await connections(h)).toBe(1);
    await h.put(specOf(key.privateKey, {}));
    await eventually(async () => (await connections(h)) === 0 || undefined);
    expect(s.accepted()).toBe(2);
  });

  it('another key opens a connection of its own; shareConnections: false logs in per replica', async () => {
    const s = await sshd('keys');
    const state = specOf(key.privateKey, { a: [replica('a1', s)] });
    state.spec.projects.push({ name: 'other', sshPrivateKey: other.privateKey });
    state.spec.services.push({ ...state.spec.services[0]!, project: 'other', replicas: [replica('o1', s)] });
    const h = await harness(state);
    await h.waitReason('main/a', 'a1', 'Connected');
    await h.waitReason('other/a', 'o1', 'Connected');
    expect(s.accepted()).toBe(2);
    expect(await connections(h)).toBe(2);

    const t = await sshd('unshared');
    const unshared = await harness(specOf(key.privateKey, { a: [replica('a1', t), replica('a2', t)], b: [replica('b1', t)] }), false);
    await threeConnected(unshared);
    expect(t.accepted()).toBe(3);
    expect(await connections(unshared)).toBe(3);
    await allServe(unshared, ['main/a', 'main/b']);
  });

  it('tofu-per-replica on a shared connection: a replica that trusted another key is refused, the new one joins', async () => {
    const s = await sshd('keys-per-replica');
    const h = await harness(specOf(key.privateKey, { a: [replica('r1', s, 'tofu-per-replica')] }));
    await h.waitReason('main/a', 'r1', 'Connected');
    const k1 = s.fingerprint();
    await s.restart({ newHostKey: true });
    // r2 may open the new connection (r1 then refuses to join it) or r1 may try first (refused
    // in its own handshake, and r2 then connects on its own): the same verdicts either way.
    await h.put(specOf(key.privateKey, { a: [replica('r1', s, 'tofu-per-replica'), replica('r2', s, 'tofu-per-replica')] }));
    await h.waitReason('main/a', 'r2', 'Connected');
    const r1 = await h.waitReason('main/a', 'r1', 'HostKeyMismatch');
    expect(r1.message).toContain(`changed from ${k1} to ${s.fingerprint()} for replica r1`);
    expect(await connections(h)).toBe(1);
    await allServe(h, ['main/a', 'main/a']);
  });
});
