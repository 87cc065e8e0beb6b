// The gateway with its real Nginx and 300 `https: true` services whose domains do not resolve
// yet (`.test`: the DNS pre-flight fails with ENOTFOUND, no certbot run, the ACME address is
// one where nothing listens) plus one plain service. The TLS loop keeps re-checking DNS every
// 30 s; Nginx must serve every site over HTTP meanwhile, and a restart on that state must be
// ready without waiting for the TLS loop's checks.

import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { api, send, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { close } from '../helpers/http.js';

const HTTPS_SERVICES = 300;
const DEADLINE_MS = 60_000;

let backend: Server;
let backendPort: number;
let first: TestGateway | undefined;
let second: Promise<TestGateway> | undefined;

function doc(): Record<string, unknown> {
  const services = Array.from({ length: HTTPS_SERVICES + 1 }, (_, i) => {
    const plain = i === HTTPS_SERVICES;
    const run = plain ? 'plain' : `s${i}`;
    return {
      project: 'main',
      run,
      domain: `${run}.bulk.test`,
      https: !plain,
      auth: false,
      replicas: [{ id: `${run}-r0`, appPort: backendPort, direct: { host: '127.0.0.1', port: backendPort } }],
    };
  });
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { acme: { server: 'https://127.0.0.1:9/directory' }, projects: [{ name: 'main' }], services },
  };
}

const domains = (): string[] => [...Array.from({ length: HTTPS_SERVICES }, (_, i) => `s${i}.bulk.test`), 'plain.bulk.test'];

/** Polls every domain until each has answered 200 from the backend once; returns the ms it took. */
async function allServed(port: number, names: string[], since: number): Promise<number> {
  let left = names;
  while (left.length > 0) {
    if (Date.now() - since > DEADLINE_MS)
      throw new Error(`${left.length} of ${names.length} sites not served after ${DEADLINE_MS} ms (e.g. ${left[0]})`);
    const next: string[] = [];
    for (let i = 0; i < left.length; i += 25) {
      const batch = left.slice(i, i + 25);
      const replies = await Promise.all(batch.map((host) => send({ port, host }).catch(() => ({ status: 0, body: '' }))));
      batch.forEach((host, j) => {
        if (replies[j]!.status !== 200 || replies[j]!.body !== 'backend') next.push(host);
      });
    }
    left = next;
    if (left.length > 0) await new Promise((r) => setTimeout(r, 100));
  }
  return Date.now() - since;
}

beforeAll(async () => {
  backend = createServer((_req, res) => res.end('backend'));
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  backendPort = (backend.address() as { port: number }).port;
});

afterAll(async () => {
  await first?.close();
  const g = await second?.catch(() => undefined);
  await g?.close();
  await first?.cleanup();
  await close(backend);
});

describe('the TLS loop never holds back Nginx', () => {
  it('serves all 301 sites over HTTP soon after the PUT, and a restart on that state is ready soon', async () => {
    first = await startTestGateway();
    const t0 = Date.now();
    const put = await api(first, { method: 'PUT', path: '/api/v1/state', body: doc() });
    expect(put.status).toBe(200);
    const servedMs = await allServed(first.httpPort, domains(), t0);
    // The TLS loop reports every domain as waiting for DNS (it re-checks every 30 s, so it is
    // never idle for long: poll its status), and spends no ACME attempt.
    type Status = {
      generation: number;
      observedGeneration: number;
      loops: Record<string, { objects: Record<string, { conditions: { type: string; reason: string }[] }> }>;
    };
    const dnsNotReady = (s: Status) =>
      Object.values(s.loops.tls?.objects ?? {}).filter((cs) => cs.conditions.some((c) => c.type === 'Ready' && c.reason === 'DNSNotReady'))
        .length;
    let status: Status;
    for (;;) {
      status = (await api(first, { path: '/api/v1/status' })).json as Status;
      if (dnsNotReady(status) === HTTPS_SERVICES) break;
      if (Date.now() - t0 > DEADLINE_MS) throw new Error(`only ${dnsNotReady(status)} domains reported DNSNotReady`);
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(status.observedGeneration).toBe(status.generation);
    expect(first.gw.controller.statuses().loops.tls?.failures).toEqual({});
    const ports = { apiPort: first.apiPort, httpPort: first.httpPort, httpsPort: first.httpsPort };
    await first.close();

    // Restart on the same state dir and ports: /readyz polled while the gateway starts.
    const t1 = Date.now();
    second = startTestGateway({ stateDir: first.stateDir, ports });
    second.catch(() => undefined);
    for (;;) {
      const r = await send({ port: ports.apiPort, path: '/readyz' }).catch(() => ({ status: 0 }));
      if (r.status === 200) break;
      if (Date.now() - t1 > DEADLINE_MS) throw new Error(`/readyz not 200 after ${DEADLINE_MS} ms`);
      await new Promise((r2) => setTimeout(r2, 50));
    }
    const readyMs = Date.now() - t1;
    await second;
    const servedAgainMs = await allServed(ports.httpPort, domains(), t1);
    // Figures for the report (machine-relative); the test asserts only the bounded polls.
    console.log(
      `[tls-pending] 301 sites served ${servedMs} ms after the PUT; /readyz 200 ${readyMs} ms after the restart; all served ${servedAgainMs} ms after it`,
    );
  }, 240_000);
});
