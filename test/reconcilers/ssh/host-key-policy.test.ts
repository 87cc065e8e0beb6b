// `hostKeyPolicy` against real sshd: a new job on a reused host and port presents fresh host keys
// (dstack's runner makes them per container). Under `tofu-per-replica` a new replica id there is
// accepted while the replica that saw the old key is refused; under `tofu` the new one is refused
// too. The same behind a jump host whose own key stays (the dockerized case), and a jump host
// whose key changes is refused until no replica that trusted it is left.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../../helpers/http.js';
import { freePort } from '../../helpers/ports.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import type { HostKeyPolicy, Replica } from '../../../src/spec/types.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

const SK = 'main/app';
let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let echo: Server;
let appPort: number;
const sshds: TestSshd[] = [];
const harnesses: Harness[] = [];

async function sshd(name: string): Promise<TestSshd> {
  const s = await startSshd({ dir: join(tmp.dir, name), authorizedKeys: [key.publicKey] });
  sshds.push(s);
  return s;
}
async function harness(replicas: Replica[]): Promise<Harness> {
  const h = await startHarness(specOf(key.privateKey, { app: replicas }));
  harnesses.push(h);
  return h;
}
const at = (s: TestSshd): { host: string; port: number; user: string } => ({ host: '127.0.0.1', port: s.port, user: s.user });
/** A replica reached at `dest`, through `proxy` when given. */
function replica(id: string, policy: HostKeyPolicy | undefined, dest: TestSshd, proxy?: TestSshd): Replica {
  return {
    id,
    appPort,
    ...(policy ? { hostKeyPolicy: policy } : {}),
    ssh: at(dest),
    ...(proxy ? { sshProxy: at(proxy) } : {}),
  };
}
const put = (h: Harness, replicas: Replica[]): Promise<void> => h.put(specOf(key.privateKey, { app: replicas }));

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-hkp-');
  key = generateKey(join(tmp.dir, 'client_ed25519'));
  appPort = await freePort();
  echo = await startEcho('app', { port: appPort });
});

afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.close()));
  await Promise.all(sshds.map((s) => s.stop()));
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('host-key policy with fresh host keys on a reused host:port', () => {
  it('tofu-per-replica: a new replica id is Ready on the new key, the old id is refused; tofu refuses both', async () => {
    const s = await sshd('direct');
    const perReplica = await harness([replica('r1', 'tofu-per-replica', s)]);
    const tofu = await harness([replica('t1', undefined, s)]);
    await perReplica.waitReason(SK, 'r1', 'Connected');
    await tofu.waitReason(SK, 't1', 'Connected');
    const k1 = s.fingerprint();

    await s.restart({ newHostKey: true }); // same port, host key K2
    expect(s.fingerprint()).not.toBe(k1);
    await put(perReplica, [replica('r1', 'tofu-per-replica', s), replica('r2', 'tofu-per-replica', s)]);
    await put(tofu, [replica('t1', undefined, s), replica('t2', undefined, s)]);

    await perReplica.waitReason(SK, 'r2', 'Connected');
    const r1 = await perReplica.waitReason(SK, 'r1', 'HostKeyMismatch');
    expect(r1.message).toContain(`changed from ${k1} to ${s.fingerprint()} for replica r1`);
    const t2 = await tofu.waitReason(SK, 't2', 'HostKeyMismatch');
    expect(t2.message).toContain(`changed from ${k1} to ${s.fingerprint()}; refusing`);
    await tofu.waitReason(SK, 't1', 'HostKeyMismatch');
    // r2 serves, r1 gets nothing; the tofu service has no Ready replica.
    for (let i = 0; i < 5; i++) {
      const reply = await perReplica.get(SK);
      expect(reply.status).toBe(200);
      expect(echoName(reply)).toBe('app');
    }
    expect((await tofu.get(SK)).status).toBe(503);
    // r1 is refused on every retry while it is in the document, not only once.
    const before = perReplica.ready(SK, 'r1')!.lastTransitionTime;
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(perReplica.ready(SK, 'r1')).toMatchObject({ reason: 'HostKeyMismatch', lastTransitionTime: before });
  }, 60_000);

  it('forgets a replica that left the document: the same id added again trusts the key it finds', async () => {
    const s = await sshd('forget');
    const h = await harness([replica('f1', 'tofu-per-replica', s)]);
    await h.waitReason(SK, 'f1', 'Connected');
    await s.restart({ newHostKey: true });
    await h.waitReason(SK, 'f1', 'HostKeyMismatch');
    await put(h, []);
    expect(h.ready(SK, 'f1')).toBeUndefined();
    await put(h, [replica('f1', 'tofu-per-replica', s)]);
    await h.waitReason(SK, 'f1', 'Connected');
  }, 60_000);
});

describe('host-key policy behind an sshProxy hop (dockerized replicas)', () => {
  it('accepts a new destination key for a new replica while the proxy keeps its key; tofu refuses it', async () => {
    const vm = await sshd('vm');
    const container = await sshd('container');
    const perReplica = await harness([replica('p1', 'tofu-per-replica', container, vm)]);
    const tofu = await harness([replica('q1', undefined, container, vm)]);
    await perReplica.waitReason(SK, 'p1', 'Connected');
    await tofu.waitReason(SK, 'q1', 'Connected');

    await container.restart({ newHostKey: true }); // a new job's container on the same VM and port
    const p = [replica('p1', 'tofu-per-replica', container, vm), replica('p2', 'tofu-per-replica', container, vm)];
    await put(perReplica, p);
    await put(tofu, [replica('q1', undefined, container, vm), replica('q2', undefined, container, vm)]);

    await perReplica.waitReason(SK, 'p2', 'Connected');
    const p1 = await perReplica.waitReason(SK, 'p1', 'HostKeyMismatch');
    expect(p1.message).toContain(`127.0.0.1:${vm.port}>127.0.0.1:${container.port} changed from`);
    expect(p1.message).toContain('for replica p1');
    const q2 = await tofu.waitReason(SK, 'q2', 'HostKeyMismatch');
    expect(q2.message).toContain(`127.0.0.1:${vm.port}>127.0.0.1:${container.port} changed from`);
    expect((await perReplica.get(SK)).status).toBe(200);

    // The VM itself presents another key: refused for p2 and for a new p3 while p1 or p2 (which
    // trusted the old one) is in the document; accepted for p3 once they left.
    await vm.restart({ newHostKey: true });
    await put(perReplica, [...p, replica('p3', 'tofu-per-replica', container, vm)]);
    const p2 = await perReplica.waitReason(SK, 'p2', 'HostKeyMismatch');
    expect(p2.message).toContain(`host key of 127.0.0.1:${vm.port} changed from`);
    const p3 = await perReplica.waitReason(SK, 'p3', 'HostKeyMismatch');
    expect(p3.message).toContain('while replicas that trusted it are in the document');
    await put(perReplica, [replica('p3', 'tofu-per-replica', container, vm)]);
    await perReplica.waitReason(SK, 'p3', 'Connected');
    expect((await perReplica.get(SK)).status).toBe(200);
  }, 90_000);
});
