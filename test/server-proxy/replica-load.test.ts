// Outstanding requests per replica, read at request time: GET /api/v1/status shows each
// replica's `load`, and /metrics shows
// replica_requests_in_flight and replica_requests_total, through the real in-server proxy to real
// HTTP replicas on 127.0.0.1.

import { createServer, type Server, type ServerResponse } from 'node:http';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { doc, send, startHarness, type Harness } from './harness.js';

let h: Harness;
let slow: Server;
let fast: Server;
let slowPort = 0;
let fastPort = 0;
const held: ServerResponse[] = [];

function listen(s: Server): Promise<number> {
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve((s.address() as { port: number }).port)));
}

beforeAll(async () => {
  slow = createServer((req, res) => {
    req.resume();
    req.on('end', () => held.push(res)); // answered when the test says so
  });
  fast = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.end('fast'));
  });
  [slowPort, fastPort] = await Promise.all([listen(slow), listen(fast)]);
  h = await startHarness();
  await h.put(
    doc([
      {
        project: 'test-proj',
        run: 'slow',
        auth: false,
        replicas: [{ id: 'slow-0', appPort: slowPort, direct: { host: '127.0.0.1', port: slowPort } }],
      },
      {
        project: 'test-proj',
        run: 'fast',
        auth: false,
        replicas: [{ id: 'fast-0', appPort: fastPort, direct: { host: '127.0.0.1', port: fastPort } }],
      },
    ]),
  );
}, 60_000);

afterAll(async () => {
  for (const r of held.splice(0)) r.destroy();
  await h?.close();
  for (const s of [slow, fast]) {
    s?.closeAllConnections();
    await new Promise<void>((r) => (s ? s.close(() => r()) : r()));
  }
});

interface StatusObject {
  conditions: { type: string; status: string }[];
  load?: { inFlight: number; requests: number };
}

async function replicaStatus(key: string): Promise<StatusObject | undefined> {
  const r = await send(`${h.apiUrl}/api/v1/status`);
  expect(r.status).toBe(200);
  return r.json<{ loops: Record<string, { objects: Record<string, StatusObject> }> }>().loops.ssh?.objects[key];
}

/** The in-server proxy's /metrics. */
async function metricsText(): Promise<string> {
  const r = await send(`${h.apiUrl}/metrics`);
  expect(r.status).toBe(200);
  return r.body.toString();
}

function sample(text: string, name: string, service: string, replica: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`dstack_proxy_${name}{service="${service}",replica="${replica}"} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

it('a replica holding a request shows it in flight in status and metrics; once answered, 0 and counted', async () => {
  await eventually(async () => ((await send(`${h.url}/proxy/services/test-proj/fast/`)).status === 200 ? true : undefined), 10_000);
  // Both replicas are on the books, with their load, before anything was sent to the slow one.
  expect(await replicaStatus('test-proj/slow/slow-0')).toMatchObject({ load: { inFlight: 0, requests: 0 } });
  expect((await replicaStatus('test-proj/fast/fast-0'))?.load?.requests).toBeGreaterThanOrEqual(1);
  const before = sample(await metricsText(), 'replica_requests_total', 'test-proj/slow', 'slow-0');
  expect(before).toBe(0);

  const answer = send(`${h.url}/proxy/services/test-proj/slow/generate`);
  await eventually(async () => (held.length === 1 ? true : undefined), 10_000);

  const during = await replicaStatus('test-proj/slow/slow-0');
  expect(during?.load).toEqual({ inFlight: 1, requests: 1 });
  expect(during?.conditions.find((c) => c.type === 'Ready')?.status).toBe('True'); // the stored status is as it was
  const text = await metricsText();
  expect(text).toContain('# TYPE dstack_proxy_replica_requests_in_flight gauge');
  expect(text).toContain('# TYPE dstack_proxy_replica_requests_total counter');
  expect(text).toContain('dstack_proxy_replica_requests_in_flight{service="test-proj/slow",replica="slow-0"} 1\n');
  expect(sample(text, 'replica_requests_total', 'test-proj/slow', 'slow-0')).toBe(1);
  // One series per replica: the other service's replica is there too.
  expect(sample(text, 'replica_requests_in_flight', 'test-proj/fast', 'fast-0')).toBeDefined();
  expect(sample(text, 'replica_requests_total', 'test-proj/fast', 'fast-0')).toBeGreaterThanOrEqual(1);

  held.shift()!.end('done');
  expect((await answer).body.toString()).toBe('done');
  // Counted until its answer ended (or, where the proxy holds a pinned keep-alive connection to
  // the replica, until that idle connection closes): a bounded wait, not a timing assertion.
  await eventually(async () => ((await replicaStatus('test-proj/slow/slow-0'))?.load?.inFlight === 0 ? true : undefined), 20_000);
  const after = await metricsText();
  expect(sample(after, 'replica_requests_in_flight', 'test-proj/slow', 'slow-0')).toBe(0);
  expect(sample(after, 'replica_requests_total', 'test-proj/slow', 'slow-0')).toBe(1);
  expect(await replicaStatus('test-proj/slow/slow-0')).toMatchObject({ load: { inFlight: 0, requests: 1 } });
}, 60_000);

it("a replica whose address changes keeps its id's count: the counter never goes back while the old one drains", async () => {
  const key = 'test-proj/slow/slow-0';
  const base = (await replicaStatus(key))!.load!.requests;
  const answer = send(`${h.url}/proxy/services/test-proj/slow/long`);
  await eventually(async () => (held.length === 1 ? true : undefined), 10_000);
  // The same replica id, now at the fast server's address.
  await h.put(
    doc([
      {
        project: 'test-proj',
        run: 'slow',
        auth: false,
        replicas: [{ id: 'slow-0', appPort: fastPort, direct: { host: '127.0.0.1', port: fastPort } }],
      },
      {
        project: 'test-proj',
        run: 'fast',
        auth: false,
        replicas: [{ id: 'fast-0', appPort: fastPort, direct: { host: '127.0.0.1', port: fastPort } }],
      },
    ]),
  );
  await eventually(
    async () => ((await send(`${h.url}/proxy/services/test-proj/slow/`)).body.toString() === 'fast' ? true : undefined),
    10_000,
  );
  const moved = await replicaStatus(key);
  // The old one, draining, still holds its request: it counts under the id.
  expect(moved?.load?.inFlight).toBeGreaterThanOrEqual(1);
  expect(moved?.load?.requests).toBeGreaterThanOrEqual(base + 2);
  const total = sample(await metricsText(), 'replica_requests_total', 'test-proj/slow', 'slow-0')!;
  expect(total).toBe(moved?.load?.requests);

  held.shift()!.end('done');
  expect((await answer).body.toString()).toBe('done');
  // Once the old one drained and left the books, the id's total is still what it was.
  await eventually(async () => {
    const text = await metricsText();
    const inFlight = sample(text, 'replica_requests_in_flight', 'test-proj/slow', 'slow-0');
    return inFlight === 0 ? text : undefined;
  }, 20_000);
  const later = sample(await metricsText(), 'replica_requests_total', 'test-proj/slow', 'slow-0')!;
  expect(later).toBeGreaterThanOrEqual(total);
  expect(h.proxy.ssh.replicas.loads().filter((l) => l.replica === 'slow-0')).toHaveLength(1);
}, 60_000);
