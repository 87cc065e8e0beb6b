// dstack's server registers one call at a time; against the real private Nginx, a stream of
// services/register calls costs at most one reload per second of calls (plus the first, which
// is applied at once), and replica registrations and unregistrations cost none.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { send, type TestGateway } from '../../helpers/gateway.js';
import { close, startEcho } from '../../helpers/http.js';
import { eventually } from '../../helpers/nginx.js';
import { freePort } from '../../helpers/ports.js';
import { startSshd, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { dstack, listed, startCompatGateway } from './harness.js';
import {
  dstackId,
  dstackPaths,
  dstackProjectKey,
  ipRateLimit,
  registerServicePayload,
  vmReplicaPayload,
  type DstackKey,
} from './fixtures.js';

const SERVICES = 30;

let tmp: ReturnType<typeof tmpDir>;
let key: DstackKey;
let sshd: TestSshd;
let app: Server;
let appPort: number;
let t: TestGateway;

beforeAll(async () => {
  tmp = tmpDir('dp-compat-reloads-');
  key = dstackProjectKey();
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  appPort = await freePort();
  app = await startEcho('reloads', { port: appPort });
  t = await startCompatGateway();
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  if (app) await close(app);
  tmp?.cleanup();
});

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** Nginx has applied everything stored: no pass running, no batch waiting for the reload interval. */
async function nginxSettled(): Promise<void> {
  await eventually(async () => {
    await t.gw.controller.whenIdle();
    return t.gw.nginxStats.waitingForReload ? undefined : true;
  }, 30_000);
}

describe('reloads under a stream of compat calls', () => {
  it(`${SERVICES} services registered one call at a time: ≤ 1 reload per second of calls + 1, the first not deferred`, async () => {
    await nginxSettled();
    // Past the interval since the start's reload: the first change must not wait for it.
    await new Promise((r) => setTimeout(r, 1_100));
    const before = { ...t.gw.nginxStats };
    const latencies: number[] = [];
    const started = Date.now();
    for (let i = 0; i < SERVICES; i++) {
      const t0 = performance.now();
      const r = await dstack(
        t,
        dstackPaths.registerService('main'),
        registerServicePayload({ runName: `svc-${i}`, auth: false, model: null, sshPrivateKey: key.privateKey }),
      );
      latencies.push(performance.now() - t0);
      expect(r.status).toBe(200);
      if (i === 0) {
        // The first change goes out without waiting for the reload interval.
        await eventually(() => (t.gw.nginxStats.reloads > before.reloads ? true : undefined), 20_000);
        expect(t.gw.nginxStats.reloadsDeferred).toBe(before.reloadsDeferred);
      }
    }
    const seconds = (Date.now() - started) / 1000;
    await nginxSettled();
    const reloads = t.gw.nginxStats.reloads - before.reloads;
    console.log(
      `services/register: ${SERVICES} calls in ${seconds.toFixed(2)} s, ${reloads} reloads, latency median ${median(latencies).toFixed(1)} ms, max ${Math.max(...latencies).toFixed(1)} ms`,
    );
    expect(reloads).toBeGreaterThanOrEqual(1);
    expect(reloads).toBeLessThanOrEqual(Math.ceil(seconds) + 1);
    expect((await listed(t)).length).toBe(SERVICES);
  }, 120_000);

  it('a service served by Host answers when its services/register does, its replica when replicas/register does', async () => {
    await nginxSettled();
    // Right after a reload: its own site waits out the reload interval, the relay by Host does not.
    const p = registerServicePayload({ runName: 'by-host-now', auth: false, model: null, sshPrivateKey: key.privateKey });
    expect((await dstack(t, dstackPaths.registerService('main'), p)).status).toBe(200);
    const early = await send({ port: t.httpPort, host: p.domain, path: '/' });
    expect(early.status).toBe(503); // the service, without a replica yet: not the unknown host's 404
    expect(JSON.parse(early.body)).toEqual({ detail: expect.stringContaining('main/by-host-now') });
    const r = await dstack(
      t,
      dstackPaths.registerReplica('main', 'by-host-now'),
      vmReplicaPayload({ jobId: dstackId(), appPort, user: sshd.user, sshPort: sshd.port }),
    );
    expect(r.status).toBe(200);
    expect((await send({ port: t.httpPort, host: p.domain, path: '/' })).status).toBe(200);
  }, 60_000);

  it('a service that needs its own site (rate limits) is served when its call answers; calls at once share reloads', async () => {
    await nginxSettled();
    const served = async (domain: string): Promise<number> => {
      // Applied: no worker of the config before it still accepts; then it answers as its site.
      const ready = t.gw.controller.statuses().loops.nginx?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
      expect(ready).toMatchObject({ status: 'True', reason: 'Applied' });
      return (await send({ port: t.httpPort, host: domain, path: '/' })).status;
    };
    const limited = (run: string) =>
      registerServicePayload({ runName: run, auth: false, model: null, rateLimits: [ipRateLimit()], sshPrivateKey: key.privateKey });
    // One at a time, each right after a reload: without the wait every one of these is deferred.
    const before = { ...t.gw.nginxStats };
    for (let i = 0; i < 3; i++) {
      const p = limited(`limited-${i}`);
      expect((await dstack(t, dstackPaths.registerService('main'), p)).status).toBe(200);
      expect(await served(p.domain)).toBe(503); // its site, without a replica yet: not the unknown host's 404
    }
    expect(t.gw.nginxStats.reloads - before.reloads).toBe(3);
    // Several at once: each answers once its site is served.
    const many = Array.from({ length: 6 }, (_, i) => limited(`limited-many-${i}`));
    const mid = t.gw.nginxStats.reloads;
    const answers = await Promise.all(many.map((p) => dstack(t, dstackPaths.registerService('main'), p)));
    for (const r of answers) expect(r.status).toBe(200);
    for (const p of many) expect(await served(p.domain)).toBe(503);
    console.log(`6 concurrent registrations of services with their own site: ${t.gw.nginxStats.reloads - mid} reload(s)`);
    // A re-send changes nothing and waits for nothing.
    const again = await dstack(t, dstackPaths.registerService('main'), many[0]);
    expect(again.status).toBe(200);
  }, 120_000);

  it('replica registrations and unregistrations: no reload', async () => {
    await nginxSettled();
    const before = t.gw.nginxStats.reloads;
    const latencies: number[] = [];
    const ids: [number, string][] = [];
    for (let i = 0; i < 10; i++) {
      const id = dstackId();
      const t0 = performance.now();
      const r = await dstack(
        t,
        dstackPaths.registerReplica('main', `svc-${i}`),
        vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: sshd.port }),
      );
      latencies.push(performance.now() - t0);
      expect(r.status).toBe(200);
      ids.push([i, id]);
    }
    for (const [i, id] of ids) expect((await dstack(t, dstackPaths.unregisterReplica('main', `svc-${i}`, id))).status).toBe(200);
    await nginxSettled();
    console.log(
      `replicas/register: ${ids.length} calls, latency median ${median(latencies).toFixed(1)} ms, max ${Math.max(...latencies).toFixed(1)} ms`,
    );
    expect(t.gw.nginxStats.reloads).toBe(before);
  }, 120_000);
});
