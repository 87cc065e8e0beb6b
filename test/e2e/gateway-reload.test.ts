// What the status says about a reload, against the real private Nginx: a site reported
// Applied is served to every new connection.

import { execa } from 'execa';
import type { Server } from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeMainConf } from '../../src/reconcilers/nginx/nginx-process.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { api, gatewayDoc, putState, startTestGateway, type SvcInput, type TestGateway } from '../helpers/gateway.js';
import { request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { startGatewayWith } from './integration-harness.js';

let echo: Server;
let echoPort: number;

beforeAll(async () => {
  [echoPort] = (await freePorts(1)) as [number];
  echo = await startEcho('echo', { port: echoPort });
});
afterAll(async () => {
  await new Promise<void>((r) => (echo ? echo.close(() => r()) : r()));
});

type Status = {
  loops: Record<
    string,
    { objects: Record<string, { conditions: { type: string; status: string; reason: string; observedGeneration: number }[] }> }
  >;
};

/** What a control server does: poll GET /api/v1/status until the site says Applied at `generation`. */
async function appliedAt(t: TestGateway, domain: string, generation: number): Promise<void> {
  await eventually(async () => {
    const s = (await api(t, { path: '/api/v1/status' })).json as Status;
    const ready = s.loops.nginx?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
    return ready?.status === 'True' && ready.reason === 'Applied' && ready.observedGeneration >= generation ? true : undefined;
  }, 20_000);
}

/**
 * Add services one PUT at a time; after each, poll the status until the new site is Applied,
 * then open `probes` fresh connections to it. Returns the probes that got the previous config
 * (a worker of it answers the unknown host with the default server's 404).
 */
async function probeAdditions(t: TestGateway, additions: number, probes: number): Promise<string[]> {
  const services: SvcInput[] = [];
  const stale: string[] = [];
  for (let i = 0; i < additions; i++) {
    services.push({ run: `add${i}`, ports: [echoPort] });
    const put = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc(services) });
    expect(put.status).toBe(200);
    const domain = `add${i}.gw.test`;
    await appliedAt(t, domain, (put.json as { generation: number }).generation);
    for (let p = 0; p < probes; p++) {
      const r = await request({ port: t.httpPort, host: domain, localAddress: '127.0.0.2' });
      if (r.status !== 200) stale.push(`${domain} probe ${p}: ${r.status}`);
    }
  }
  return stale;
}

describe('Applied means served', () => {
  it('private Nginx: once the status says Applied, every fresh connection gets the new site (5 additions × 30 probes)', async () => {
    const t = await startTestGateway();
    try {
      expect(await probeAdditions(t, 5, 30)).toEqual([]);
    } finally {
      await t.cleanup();
    }
  });

  it('system Nginx (reload command returns at once): Applied only once the previous workers stopped accepting', async () => {
    // The operator's Nginx, daemonised, with its pid file named in its main conf.
    const dir = await mkdtemp(join(tmpdir(), 'dp-sysng-'));
    // Workers as root: they connect to the gateway's root-owned balancer sockets.
    const paths = await writeMainConf(dir, { user: 'root', workerProcesses: 2 });
    const start = await execa('/usr/sbin/nginx', ['-p', dir, '-c', paths.confPath], { reject: false });
    expect(start.exitCode, start.stderr).toBe(0);
    const t = await startGatewayWith({
      nginx: 'system',
      sitesDir: paths.confDir,
      nginxConf: paths.confPath,
      reloadCommand: `/usr/sbin/nginx -s reload -p ${dir} -c ${paths.confPath}`,
      testCommand: `/usr/sbin/nginx -t -q -p ${dir}`,
    });
    try {
      expect(await probeAdditions(t, 5, 30)).toEqual([]);
    } finally {
      await t.cleanup();
      await execa('/usr/sbin/nginx', ['-s', 'stop', '-p', dir, '-c', paths.confPath], { reject: false });
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('reloads under a stream of changes', () => {
  it('the first change reloads at once; changes made within a second of a reload go in together with one more', async () => {
    const clock = new FakeClock(Date.now());
    const t = await startTestGateway({ deps: { clock } });
    const reloads = async (): Promise<number> => {
      const m = /^dstack_proxy_nginx_reloads_total (\d+)$/m.exec((await api(t, { path: '/metrics' })).body);
      return Number(m?.[1]);
    };
    try {
      const atStart = await reloads();
      clock.advance(1_000); // a quiet second since the start's reload
      const services: SvcInput[] = [{ run: 'first', ports: [echoPort] }];
      await putState(t, gatewayDoc(services)); // returns once the controller is idle: no waiting for time
      expect(await reloads()).toBe(atStart + 1);
      expect((await request({ port: t.httpPort, host: 'first.gw.test', localAddress: '127.0.0.2' })).status).toBe(200);

      // Five more PUTs, one service each, while the clock stands still inside that second.
      let generation = 0;
      for (let i = 0; i < 5; i++) {
        services.push({ run: `burst${i}`, ports: [echoPort] });
        const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc(services) });
        expect(r.status).toBe(200);
        generation = (r.json as { generation: number }).generation;
      }
      // The loop holds a batch until the second is over (it never reloads in the meantime).
      await eventually(() => (t.gw.controller.statuses().generation === generation && t.gw.nginxStats.waitingForReload ? true : undefined));
      expect(await reloads()).toBe(atStart + 1);
      clock.advance(1_000);
      await t.gw.controller.whenIdle();
      expect(await reloads()).toBe(atStart + 2);
      for (let i = 0; i < 5; i++) {
        expect((await request({ port: t.httpPort, host: `burst${i}.gw.test`, localAddress: '127.0.0.2' })).status).toBe(200);
      }
      expect((await api(t, { path: '/metrics' })).body).toMatch(/^dstack_proxy_nginx_reloads_deferred_total [1-9]\d*$/m);

      // A batch waiting out the second goes at once when a caller waits for it (hurry), the
      // clock still standing inside that second.
      services.push({ run: 'waited', ports: [echoPort] });
      const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc(services) });
      generation = (r.json as { generation: number }).generation;
      await eventually(() => (t.gw.controller.statuses().generation === generation && t.gw.nginxStats.waitingForReload ? true : undefined));
      t.gw.hurryReload(generation);
      await eventually(async () => ((await reloads()) === atStart + 3 ? true : undefined));
      expect(t.gw.nginxStats.reloadsHurried).toBe(0); // it was waiting: woken, not skipped
      // Until a reload at that generation, no batch waits; after it, they wait again.
      t.gw.hurryReload(generation + 1);
      services.push({ run: 'hurried', ports: [echoPort] });
      await putState(t, gatewayDoc(services));
      expect(await reloads()).toBe(atStart + 4);
      expect(t.gw.nginxStats.reloadsHurried).toBe(1);
      expect((await request({ port: t.httpPort, host: 'hurried.gw.test', localAddress: '127.0.0.2' })).status).toBe(200);
    } finally {
      clock.advance(60_000);
      await t.cleanup();
    }
  });
});
