// --ssh-share-connections through the gateway: two replicas behind the same sshd, the same hops
// and key, log in once by default and once each with the option false (sshd's log counts the
// logins; /metrics shows the connections); both ways every replica serves through Nginx.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, integrationDoc, scrape, startGatewayWith } from './integration-harness.js';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
const apps: Server[] = [];
let appPorts: [number, number];
const cleanups: (() => Promise<void>)[] = [];

beforeAll(async () => {
  tmp = tmpDir('dp-int-ssh-share-');
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  appPorts = (await freePorts(2)) as [number, number];
  apps.push(await startEcho('app-a', { port: appPorts[0] }), await startEcho('app-b', { port: appPorts[1] }));
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  for (const s of apps) await close(s);
  tmp?.cleanup();
});

/** A gateway with `flags` serving services a and b, one replica each behind a fresh sshd. */
async function twoReplicas(name: string, flags: Record<string, string>): Promise<{ t: TestGateway; sshd: TestSshd }> {
  const sshd = await startSshd({ dir: join(tmp.dir, name), authorizedKeys: [key.publicKey] });
  cleanups.push(() => sshd.stop());
  const t = await startGatewayWith(flags);
  cleanups.push(() => t.cleanup());
  const replica = (id: string, appPort: number) => ({ id, appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } });
  const doc = integrationDoc({
    sshPrivateKey: key.privateKey,
    services: [
      { run: 'a', domain: `a.${name}.gw.test`, replicas: [replica('ra', appPorts[0])] },
      { run: 'b', domain: `b.${name}.gw.test`, replicas: [replica('rb', appPorts[1])] },
    ],
  });
  expect((await putState(t, doc)).status).toBe(200);
  for (const [run, app] of [
    ['a', 'app-a'],
    ['b', 'app-b'],
  ] as const) {
    await eventually(async () => {
      const r = await call({ port: t.httpPort, host: `${run}.${name}.gw.test`, path: '/' });
      return r.status === 200 && (JSON.parse(r.body) as { name: string }).name === app ? true : undefined;
    }, 30_000);
  }
  return { t, sshd };
}

async function connections(t: TestGateway): Promise<number | undefined> {
  return (await scrape(t)).find((s) => s.name === 'dstack_proxy_ssh_connections')?.value;
}

describe('--ssh-share-connections', () => {
  it('by default, replicas behind identical hops share one login', async () => {
    const { t, sshd } = await twoReplicas('shared', {});
    expect(sshd.accepted()).toBe(1);
    expect(await connections(t)).toBe(1);
  });

  it('false: a login per replica', async () => {
    const { t, sshd } = await twoReplicas('unshared', { sshShareConnections: 'false' });
    expect(sshd.accepted()).toBe(2);
    expect(await connections(t)).toBe(2);
  });
});
