// The in-server proxy after a replica leaves the document: a keep-alive client's requests after
// the removal all go to the replica left, the requests queued on the removed replica's pool (its
// one connection busy) too, and its request in flight completes there.

import { Agent } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { holdingReplica, sendAlone, type HoldingReplica } from '../helpers/holding-replica.js';
import { eventually } from '../helpers/nginx.js';
import { send, startHarness, type Harness } from './harness.js';

let h: Harness;
let a: HoldingReplica;
let b: HoldingReplica;
const SK = 'p/svc';

const docOf = (replicas: HoldingReplica[]): Record<string, unknown> => ({
  apiVersion: 'proxy.dstack.ai/v1alpha1',
  kind: 'ProxyState',
  spec: {
    projects: [{ name: 'p' }],
    services: [
      {
        project: 'p',
        run: 'svc',
        auth: false,
        replicas: replicas.map((x) => ({ id: x.name, appPort: x.port, direct: { host: '127.0.0.1', port: x.port } })),
      },
    ],
  },
});
const inFlight = (id: string): number | undefined =>
  h.proxy.ssh.replicas.loads().find((l) => l.service === SK && l.replica === id && !l.draining)?.inFlight;
const port = (): number => Number(new URL(h.url).port);
const path = (p: string): string => `/proxy/services/p/svc${p}`;

beforeAll(async () => {
  [a, b] = await Promise.all([holdingReplica('a', true), holdingReplica('b', true)]);
  h = await startHarness({}, { ssh: { replicas: { connectionsPerReplica: 1 } }, authorize: async () => 'allow' });
  await h.put(docOf([a, b]));
  await eventually(() => (inFlight('a') !== undefined && inFlight('b') !== undefined ? true : undefined), 20_000);
}, 60_000);

afterAll(async () => {
  a?.release();
  b?.release();
  await h?.close();
  await Promise.all([a?.close(), b?.close()]);
});

describe('a replica removed from the in-server proxy document', () => {
  it('gets no new request, queued ones included; its request in flight completes', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const warm: string[] = [];
      for (let i = 0; i < 10; i++) warm.push((await send(`${h.url}${path(`/warm/${i}`)}`, { agent })).headers['x-replica'] as string);
      expect(new Set(warm)).toEqual(new Set(['a', 'b']));
      // One held request on each replica (its only connection busy), then four queued, two on each.
      const first = [sendAlone(port(), '127.0.0.1', path('/hold/1')), sendAlone(port(), '127.0.0.1', path('/hold/2'))];
      await eventually(() => (a.held.length === 1 && b.held.length === 1 ? true : undefined), 15_000);
      const queued = Array.from({ length: 4 }, (_, i) => sendAlone(port(), '127.0.0.1', path(`/queued/${i}`)));
      await eventually(() => (inFlight('a') === 3 && inFlight('b') === 3 ? true : undefined), 15_000);
      const aGot = a.got.length;

      await h.put(docOf([b]));
      await eventually(() => (inFlight('a') === undefined ? true : undefined), 15_000);
      expect(inFlight('b')).toBe(5);
      b.release();
      const answers = await Promise.all(queued);
      expect(answers.map((x) => `${x.status} ${x.replica}`)).toEqual(Array(4).fill('200 b'));
      // 50 more on the keep-alive connection held since before the removal.
      for (let i = 0; i < 50; i++) {
        const r = await send(`${h.url}${path(`/after/${i}`)}`, { agent });
        expect(`${r.status} ${String(r.headers['x-replica'])}`).toBe('200 b');
      }
      a.release();
      const held = await Promise.all(first);
      expect(held.map((x) => `${x.status} ${x.body}`).sort()).toEqual(['200 a:held', '200 b:held']);
      expect(a.got.slice(aGot)).toEqual([]);
      expect(a.got.filter((p) => p.includes('/queued/') || p.includes('/after/'))).toEqual([]);
    } finally {
      agent.destroy();
    }
  }, 60_000);
});
