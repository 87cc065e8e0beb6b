// Removing a service on a running gateway (real Nginx, direct replicas on 127.0.0.1) with a
// long drain period: Nginx holds pooled keep-alive connections to the data plane's shared
// socket, yet the removal and a service added in the next PUT take effect at once, and the
// removed service never answers 502/503 (its replicas stay for requests in flight until its
// site is gone).

import { existsSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, gatewayDoc, send, type TestGateway } from '../helpers/gateway.js';
import { close } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { startGatewayWith } from './integration-harness.js';

const DRAIN_S = 60;
/** Well under the drain period: a removal that waits for the drain fails clearly. */
const LIMIT_MS = 10_000;

let backend: Server;
let port: number;
let t: TestGateway;

const errorLog = (): string => {
  try {
    return readFileSync(join(t.stateDir, 'nginx', 'logs', 'error.log'), 'utf8');
  } catch {
    return '';
  }
};
const connectFailures = (text: string): number => text.split('\n').filter((l) => /connect\(\) to unix:.* failed/.test(l)).length;

beforeAll(async () => {
  backend = createServer((req, res) => res.end(`backend ${req.headers.host ?? ''}`));
  backend.keepAliveTimeout = 120_000;
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  port = (backend.address() as { port: number }).port;
  t = await startGatewayWith({ drainPeriod: String(DRAIN_S) });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  if (backend) await close(backend);
});

describe('a removal never stalls the gateway', () => {
  const put = async (runs: string[]) => {
    const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc(runs.map((run) => ({ run, ports: [port] }))) });
    expect(r.status).toBe(200);
  };
  // Fresh connections may reach a worker of the previous configuration for a moment after a
  // reload: wait for a run of answers from the new one.
  const settled = async (host: string, status: number): Promise<true | undefined> => {
    for (let i = 0; i < 10; i++) if ((await send({ port: t.httpPort, host })).status !== status) return undefined;
    return true;
  };
  /** Traffic: afterwards Nginx keeps idle upstream connections to the service's socket pooled. */
  const warm = async (host: string) => {
    await eventually(() => settled(host, 200));
    for (let i = 0; i < 20; i++) expect((await send({ port: t.httpPort, host })).status).toBe(200);
  };

  it('a service added in the PUT after a removal answers without waiting for the drain period', async () => {
    await put(['a', 'c']);
    await warm('a.gw.test');
    const t0 = Date.now();
    await put(['c']);
    await put(['c', 'b']);
    await eventually(async () => ((await send({ port: t.httpPort, host: 'b.gw.test' })).status === 200 ? true : undefined), LIMIT_MS);
    const bMs = Date.now() - t0;
    await eventually(() => settled('a.gw.test', 404), LIMIT_MS);
    // The service closes once Nginx no longer routes to it, long before the drain period ends;
    // the shared socket stays for the others.
    await eventually(async () => (t.gw.ssh.balancer.listening().includes('main/a') ? undefined : true), LIMIT_MS);
    expect(existsSync(t.gw.ssh.balancer.sharedSocketPath!)).toBe(true);
    expect((await send({ port: t.httpPort, host: 'c.gw.test' })).status).toBe(200);
    console.log(`[removal] b answered ${bMs} ms after the PUT removing a (drain period ${DRAIN_S} s)`);
  }, 120_000);

  it('a service being removed answers 200 or 404, never 502/503: its replicas outlive its site', async () => {
    await put(['b', 'c', 'd']);
    await warm('d.gw.test');
    const failuresBefore = connectFailures(errorLog());
    // Requests to `d` all through its removal: each is served or 404, never a 502/503.
    const seen = new Map<number, number>();
    let stop = false;
    const hammer = (async () => {
      while (!stop) {
        const r = await send({ port: t.httpPort, host: 'd.gw.test' }).catch(() => ({ status: 0 }));
        seen.set(r.status, (seen.get(r.status) ?? 0) + 1);
      }
    })();
    const t0 = Date.now();
    let goneMs = 0;
    try {
      await put(['b', 'c']);
      await eventually(() => settled('d.gw.test', 404), LIMIT_MS);
      goneMs = Date.now() - t0;
      await eventually(async () => (t.gw.ssh.balancer.listening().includes('main/d') ? undefined : true), LIMIT_MS);
    } finally {
      stop = true;
      await hammer;
    }
    expect([...seen.keys()].filter((s) => s !== 200 && s !== 404)).toEqual([]);
    expect(connectFailures(errorLog()) - failuresBefore).toBe(0);
    console.log(
      `[removal] d answered 404 ${goneMs} ms after the PUT removing it; requests to d meanwhile: ${JSON.stringify(Object.fromEntries(seen))}`,
    );
  }, 120_000);
});
