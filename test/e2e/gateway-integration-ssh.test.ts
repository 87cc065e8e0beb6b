// The gateway end to end over SSH: a replica behind a real sshd (one hop, the project's key), the
// app a small HTTP server on 127.0.0.1. Requests go Nginx → the service's balancer socket → the
// ssh2 tunnel → sshd → the app. A replica added by PUT gets traffic without an Nginx reload.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, integrationDoc, startGatewayWith, type ReplicaDoc } from './integration-harness.js';

const DOMAIN = 'tunnel.gw.test';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let sshd: TestSshd;
let t: TestGateway;
const apps: Server[] = [];
let appPorts: [number, number];

beforeAll(async () => {
  tmp = tmpDir('dp-int-ssh-');
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  appPorts = (await freePorts(2)) as [number, number];
  apps.push(await startEcho('app-a', { port: appPorts[0] }), await startEcho('app-b', { port: appPorts[1] }));
  t = await startGatewayWith({}, { ssh: { keepaliveIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } });
});

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  for (const s of apps) await close(s);
  tmp?.cleanup();
});

function sshReplica(id: string, appPort: number): ReplicaDoc {
  return { id, appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } };
}

function doc(replicas: ReplicaDoc[]): Record<string, unknown> {
  return integrationDoc({ sshPrivateKey: key.privateKey, services: [{ run: 'tunnel', domain: DOMAIN, replicas }] });
}

async function who(): Promise<string> {
  const r = await call({ port: t.httpPort, host: DOMAIN, path: '/hello' });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
  return (JSON.parse(r.body) as { name: string }).name;
}

describe('replicas behind sshd', () => {
  it('routes requests through Nginx and the SSH tunnel to the replica app', async () => {
    const r = await putState(t, doc([sshReplica('tunnel-a', appPorts[0])]));
    expect(r.status).toBe(200);
    expect(await eventually(async () => ((await who().catch(() => undefined)) === 'app-a' ? true : undefined), 30_000)).toBe(true);
    const reply = await call({ port: t.httpPort, host: DOMAIN, path: '/hello?q=1' });
    const echoed = JSON.parse(reply.body) as { url: string; headers: Record<string, string> };
    expect(echoed.url).toBe('/hello?q=1');
    expect(echoed.headers.host).toBe(DOMAIN);
    expect(sshd.accepted()).toBeGreaterThanOrEqual(1);

    const status = await api(t, { path: '/api/v1/status' });
    const objects =
      (status.json as { loops: Record<string, { objects: Record<string, { conditions: { type: string; status: string }[] }> }> }).loops.ssh
        ?.objects ?? {};
    expect(objects['main/tunnel/tunnel-a']?.conditions.find((c) => c.type === 'Ready')?.status).toBe('True');
  });

  it('sends traffic to a replica added by PUT without reloading Nginx', async () => {
    await eventually(async () => ((await who().catch(() => undefined)) === 'app-a' ? true : undefined), 30_000);
    const reloads = t.gw.nginxStats.reloads;
    const r = await putState(t, doc([sshReplica('tunnel-a', appPorts[0]), sshReplica('tunnel-b', appPorts[1])]));
    expect(r.status).toBe(200);
    expect(r.json.changed).toBe(true);
    // Concurrent requests open several upstream connections; the balancer spreads them.
    const seen = await eventually(async () => {
      const names = await Promise.all(Array.from({ length: 8 }, () => who().catch(() => 'error')));
      return names.includes('app-b') ? names : undefined;
    }, 60_000);
    expect(seen).toContain('app-b');
    expect(t.gw.nginxStats.reloads).toBe(reloads);
  });

  it('stops sending traffic to a replica removed by PUT, again without a reload', async () => {
    const reloads = t.gw.nginxStats.reloads;
    const r = await putState(t, doc([sshReplica('tunnel-b', appPorts[1])]));
    expect(r.status).toBe(200);
    // Once the removed replica's pooled connections are retired, every answer comes from app-b.
    await eventually(async () => {
      const names = await Promise.all(Array.from({ length: 8 }, () => who().catch(() => 'error')));
      return names.every((n) => n === 'app-b') ? true : undefined;
    }, 60_000);
    expect(t.gw.nginxStats.reloads).toBe(reloads);
  });
});
