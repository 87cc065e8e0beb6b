// Stats through a real Nginx: requests → access log → tail → GET /api/stats/collect.

import { appendFile, rename, stat, truncate } from 'node:fs/promises';
import type { Server } from 'node:http';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authRoutes } from '../../src/api/auth-routes.js';
import { statsRoutes } from '../../src/api/stats-routes.js';
import { createStatsCollector, type ServiceStats, type StatsCollector } from '../../src/stats/index.js';
import { API_VERSION, KIND, type ProxyState, type Service } from '../../src/spec/types.js';
import { serveState } from '../api/nginx-site.js';
import { close, request } from '../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { startEcho } from '../helpers/http.js';

let ng: TestNginx;
let echo: Server;
let gw: FastifyInstance;
let sc: StatsCollector;
let state: ProxyState;
/** Every request sent through Nginx to a logged site: the number of lines to wait for. */
let sent = 0;

function service(over: Partial<Service> & { run: string }): Service {
  return {
    project: 'main',
    https: false,
    auth: false,
    clientMaxBodySize: 1 << 20,
    stripPrefix: true,
    rateLimits: [],
    replicas: [],
    ...over,
  };
}

async function send(host: string, n: number, path = '/', headers: Record<string, string> = {}): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < n; i++) {
    statuses.push((await request({ port: ng.httpPort, host, path, headers, localAddress: '127.0.0.2' })).status);
    sent++;
  }
  return statuses;
}

async function collect(): Promise<Map<string, ServiceStats['stats']>> {
  const r = await gw.inject({ method: 'GET', url: '/api/stats/collect' });
  expect(r.statusCode).toBe(200);
  return new Map((r.json() as ServiceStats[]).map((s) => [s.run_name, s.stats]));
}

/** Wait until the collector read every line Nginx wrote for the requests sent so far. */
async function settled(): Promise<Map<string, ServiceStats['stats']>> {
  await eventually(async () => {
    await sc.poll();
    return sc.counters().lines >= sent ? true : undefined;
  });
  return collect();
}

const requests = (m: Map<string, ServiceStats['stats']>, run: string, w: '30' | '60' | '300' = '300') => m.get(run)![w].requests;

beforeAll(async () => {
  const [echoPort, gwPort] = (await freePorts(2)) as [number, number];
  ng = await startTestNginx();
  echo = await startEcho('replica', { port: echoPort });
  const replicas = [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: echoPort } }];
  state = {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.test/dir' },
      projects: [{ name: 'main' }],
      services: [
        service({
          run: 'busy',
          domain: 'busy.gw.test',
          replicas,
          rateLimits: [{ prefix: '/limited', key: { type: 'ipAddress' }, rps: 1 / 60, burst: 0 }],
        }),
        service({ run: 'idle', domain: 'idle.gw.test', replicas }),
        service({ run: 'locked', domain: 'locked.gw.test', replicas, auth: true }),
      ],
      entrypoints: [],
    },
  };
  sc = createStatsCollector({ accessLogPath: ng.accessLogPath, startAt: 'start' });
  gw = Fastify();
  await gw.register(authRoutes, { auth: { check: async () => 'deny', close: async () => undefined } });
  await gw.register(statsRoutes, { collector: sc, getState: () => state });
  await gw.listen({ port: gwPort, host: '127.0.0.1' });
  await serveState(ng, state, `http://127.0.0.1:${gwPort}`);
  sc.start();
});

afterAll(async () => {
  await sc?.stop();
  await gw?.close();
  if (echo) await close(echo);
  await ng?.stop();
});

describe('stats through a real Nginx', () => {
  it('N requests → N in the 30 s window with a plausible request time; idle services report zeros', async () => {
    expect(await send('busy.gw.test', 25)).toEqual(Array(25).fill(200));
    const m = await settled();
    expect(requests(m, 'busy', '30')).toBe(25);
    expect(requests(m, 'busy', '60')).toBe(25);
    const t = m.get('busy')!['30'].request_time;
    expect(t).toBeGreaterThanOrEqual(0);
    expect(t).toBeLessThan(1);
    expect(m.get('idle')).toEqual({
      '30': { requests: 0, request_time: 0 },
      '60': { requests: 0, request_time: 0 },
      '300': { requests: 0, request_time: 0 },
    });
  });

  it("401s from auth and 429s from rate limits don't count", async () => {
    const before = await settled();
    expect(await send('locked.gw.test', 5)).toEqual(Array(5).fill(401));
    const limited = await send('busy.gw.test', 20, '/limited');
    const ok = limited.filter((s) => s === 200).length;
    expect(limited.filter((s) => s === 429).length).toBeGreaterThan(0);
    expect(ok + limited.filter((s) => s === 429).length).toBe(20);
    const m = await settled();
    expect(requests(m, 'locked')).toBe(0);
    expect(requests(m, 'busy') - requests(before, 'busy')).toBe(ok);
  });

  it('a rename + reopen mid-run loses and doubles nothing', async () => {
    const before = await settled();
    const rotations = sc.counters().rotations;
    await send('busy.gw.test', 10);
    await sc.poll();
    await rename(ng.accessLogPath, `${ng.accessLogPath}.1`);
    await send('busy.gw.test', 10); // still written to the renamed file
    process.kill(ng.proc.pid!, 'SIGUSR1'); // nginx -s reopen
    await eventually(() =>
      stat(ng.accessLogPath).then(
        () => true,
        () => undefined,
      ),
    );
    await send('busy.gw.test', 10);
    const m = await settled();
    expect(requests(m, 'busy') - requests(before, 'busy')).toBe(30);
    expect(sc.counters().rotations).toBe(rotations + 1);
    // nothing more arrives later either
    await sc.poll();
    expect(requests(await collect(), 'busy')).toBe(requests(before, 'busy') + 30);
  });

  it('a truncated log (copytruncate) is read again from its start', async () => {
    const before = await settled();
    await truncate(ng.accessLogPath, 0);
    await send('busy.gw.test', 4);
    const m = await settled();
    expect(requests(m, 'busy') - requests(before, 'busy')).toBe(4);
    expect(sc.counters().truncations).toBeGreaterThanOrEqual(1);
  });

  it('a malformed line is skipped and counted', async () => {
    const before = await settled();
    const skipped = sc.counters().skipped;
    await appendFile(ng.accessLogPath, 'not an access log line\n');
    sent++;
    await send('busy.gw.test', 3);
    const m = await settled();
    expect(requests(m, 'busy') - requests(before, 'busy')).toBe(3);
    expect(sc.counters().skipped).toBe(skipped + 1);
  });
});
