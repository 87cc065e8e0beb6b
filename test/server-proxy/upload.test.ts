// A 1 GiB streamed upload through the proxy: memory stays flat (no buffering), the replica
// gets every byte. Measured in this process, which holds the proxy, the client and the replica.

import { afterAll, beforeAll, expect, it } from 'vitest';
import { directService, doc, send, startHarness, untilStatus, zeros, type Harness } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

const GiB = 1024 * 1024 * 1024;
const CHUNK = 1024 * 1024; // 1 MiB

let h: Harness;
let replica: TestReplica;

beforeAll(async () => {
  replica = await startReplica();
  h = await startHarness();
  await h.put(doc([directService('test-proj', 'big', replica.port, { clientMaxBodySize: 2 * GiB })]));
  await untilStatus(`${h.url}/proxy/services/test-proj/big/sink`, 200);
}, 60_000);

afterAll(async () => {
  await h?.close();
  await replica?.close();
});

it('streams a 1 GiB upload with RSS growing < 50 MB', async () => {
  // Warm up the code paths, then measure.
  await send(`${h.url}/proxy/services/test-proj/big/sink`, {
    method: 'POST',
    body: zeros(64 * CHUNK),
    headers: { 'content-length': String(64 * CHUNK) },
  });
  global.gc?.();
  const before = process.memoryUsage().rss;
  let peak = before;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  const r = await send(`${h.url}/proxy/services/test-proj/big/sink`, {
    method: 'POST',
    body: zeros(GiB),
    headers: { 'content-length': String(GiB) },
  });
  clearInterval(timer);
  peak = Math.max(peak, process.memoryUsage().rss);
  expect(r.status).toBe(200);
  expect(r.json<{ bytes: number }>().bytes).toBe(GiB);
  expect(peak - before).toBeLessThan(50 * 1024 * 1024);
}, 300_000);

it('streams a chunked 256 MiB upload (counted against the limit) just as flat', async () => {
  const before = process.memoryUsage().rss;
  let peak = before;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  const r = await send(`${h.url}/proxy/services/test-proj/big/sink`, { method: 'POST', body: zeros(256 * CHUNK) });
  clearInterval(timer);
  expect(r.status).toBe(200);
  expect(r.json<{ bytes: number }>().bytes).toBe(256 * CHUNK);
  expect(peak - before).toBeLessThan(50 * 1024 * 1024);
}, 300_000);
