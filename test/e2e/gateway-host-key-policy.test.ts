// `hostKeyPolicy` from a PUT document to traffic through the real gateway (Nginx → balancer →
// SSH tunnel → replica app): an sshd restarted on the same port with a fresh host key (a new job
// on a reused host:port) serves a new `tofu-per-replica` replica, while the replica that saw the
// old key and a new `tofu` replica are refused with HostKeyMismatch.

import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answersFrom, startNamedReplica, type NamedReplica } from '../helpers/balancing.js';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, integrationDoc, startGatewayWith, type ReplicaDoc } from './integration-harness.js';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let sshd: TestSshd;
let app: NamedReplica;
let t: TestGateway;

const domain = (run: string): string => `${run}.hkp.test`;
const replica = (id: string, policy?: 'tofu-per-replica'): ReplicaDoc => {
  const r = {
    id,
    appPort: app.port,
    ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user },
    ...(policy ? { hostKeyPolicy: policy } : {}),
  };
  return r;
};

async function put(services: Record<string, ReplicaDoc[]>): Promise<void> {
  const doc = integrationDoc({
    sshPrivateKey: key.privateKey,
    services: Object.entries(services).map(([run, replicas]) => ({ run, domain: domain(run), replicas })),
  });
  const res = await putState(t, doc);
  expect(res.status, res.body).toBe(200);
}

async function ready(run: string, id: string): Promise<{ status: string; reason: string; message: string } | undefined> {
  const s = await api(t, { path: '/api/v1/status' });
  const o = (
    s.json as {
      loops: Record<
        string,
        { objects: Record<string, { conditions: { type: string; status: string; reason: string; message: string }[] }> }
      >;
    }
  ).loops.ssh?.objects[`main/${run}/${id}`];
  return o?.conditions.find((c) => c.type === 'Ready');
}
const reason = (run: string, id: string, want: string): Promise<{ message: string }> =>
  eventually(async () => {
    const c = await ready(run, id);
    return c?.reason === want ? c : undefined;
  }, 30_000);

beforeAll(async () => {
  tmp = tmpDir('dp-hkp-');
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  app = await startNamedReplica('app');
  t = await startGatewayWith({}, { ssh: { keepaliveIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  await app?.close();
  tmp?.cleanup();
});

describe('hostKeyPolicy through the gateway', () => {
  it('a new tofu-per-replica replica serves on the fresh key of a reused host:port; the old one and tofu are refused', async () => {
    await put({ job: [replica('r1', 'tofu-per-replica')], plain: [replica('t1')] });
    await reason('job', 'r1', 'Connected');
    await reason('plain', 't1', 'Connected');
    await answersFrom(t.httpPort, domain('job'), ['app']);
    const k1 = sshd.fingerprint();

    await sshd.restart({ newHostKey: true }); // the next job's container: same port, new host key
    await reason('job', 'r1', 'HostKeyMismatch');
    await put({ job: [replica('r1', 'tofu-per-replica'), replica('r2', 'tofu-per-replica')], plain: [replica('t1'), replica('t2')] });
    await reason('job', 'r2', 'Connected');
    const t2 = await reason('plain', 't2', 'HostKeyMismatch');
    expect(t2.message).toContain(`changed from ${k1} to ${sshd.fingerprint()}`);
    expect((await ready('job', 'r1'))?.reason).toBe('HostKeyMismatch');

    for (let i = 0; i < 5; i++) {
      const r = await call({ port: t.httpPort, host: domain('job'), path: `/after/${i}` });
      expect(`${r.status} ${r.body}`).toBe('200 app');
    }
    expect((await call({ port: t.httpPort, host: domain('plain'), path: '/' })).status).toBe(503);
  }, 90_000);
});
