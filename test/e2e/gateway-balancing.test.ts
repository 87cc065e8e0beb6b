// Per-request balancing through the real gateway: client → Nginx (keep-alive both ways) → the
// service's balancer socket → a replica chosen for each request by least outstanding requests →
// a direct TCP replica or one behind a real sshd. The replicas answer with their own name and
// count what they got. Replica changes by PUT reach traffic on connections Nginx already holds,
// without an Nginx reload.

import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  countsSince,
  KeepAliveClient,
  startNamedReplica,
  type KeptReply,
  type NamedReplica,
  allReplicasReady,
  answersFrom as answersFromAll,
} from '../helpers/balancing.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import {
  directReplica,
  integrationDoc,
  sampleValue,
  scrape,
  startGatewayWith,
  type ReplicaDoc,
  type ServiceDoc,
} from './integration-harness.js';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let sshd: TestSshd;
let t: TestGateway;
const r: Record<string, NamedReplica> = {};
/** The services of the document, by run; put() sends them all. */
const services = new Map<string, ReplicaDoc[]>();

const domain = (run: string): string => `${run}.bal.test`;

async function put(): Promise<void> {
  const doc = integrationDoc({
    sshPrivateKey: key.privateKey,
    services: [...services].map(([run, replicas]): ServiceDoc => ({ run, domain: domain(run), replicas })),
  });
  const res = await putState(t, doc);
  expect(res.status, res.body).toBe(200);
}

const allReady = (): Promise<true | undefined> => allReplicasReady(t, services);

/** Waits until `run` answers 200 from every replica named in `names`. */
const answersFrom = (run: string, names: string[]): Promise<void> => answersFromAll(t.httpPort, domain(run), names);

const reloads = async (): Promise<number | undefined> => sampleValue(await scrape(t), 'dstack_proxy_nginx_reloads_total');

beforeAll(async () => {
  tmp = tmpDir('dp-bal-');
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  for (const name of ['direct-a', 'ssh-b', 'grow-1', 'grow-2', 'moving-old', 'moving-new']) r[name] = await startNamedReplica(name);
  r['slow'] = await startNamedReplica('slow', { delayMs: 1_000 });
  r['fast'] = await startNamedReplica('fast', { delayMs: 10 });
  t = await startGatewayWith({}, { ssh: { keepaliveIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } });
  services.set('spread', [
    directReplica('a', r['direct-a']!.port),
    { id: 'b', appPort: r['ssh-b']!.port, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } },
  ]);
  services.set('share', [directReplica('slow', r['slow']!.port), directReplica('fast', r['fast']!.port)]);
  services.set('grow', [directReplica('g1', r['grow-1']!.port)]);
  services.set('moving', [directReplica('m', r['moving-old']!.port)]);
  await put();
  await eventually(allReady, 30_000);
  await answersFrom('spread', ['direct-a', 'ssh-b']);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  for (const x of Object.values(r)) await x.close();
  tmp?.cleanup();
});

describe('per-request balancing through the gateway', () => {
  it('spreads 100 sequential requests on one keep-alive connection over a direct and an SSH replica', async () => {
    const reps = [r['direct-a']!, r['ssh-b']!];
    const before = reps.map((x) => x.got.length);
    const client = new KeepAliveClient(t.httpPort, domain('spread'), 1);
    const replies: KeptReply[] = [];
    try {
      for (let i = 0; i < 100; i++) replies.push(await client.request(`/seq/${i}`));
    } finally {
      client.close();
    }
    expect(replies.filter((x) => x.status !== 200)).toEqual([]);
    expect(client.sockets.size).toBe(1);
    const counts = countsSince(reps, before);
    console.log(`[balancing] 100 sequential requests on one connection: direct ${counts[0]}, ssh ${counts[1]}`);
    expect(counts[0]! + counts[1]!).toBe(100);
    // What each replica answered is what it counted: the answers are not mixed up on the way.
    expect(replies.filter((x) => x.body === 'direct-a').length).toBe(counts[0]);
    for (const c of counts) {
      expect(c).toBeGreaterThanOrEqual(40);
      expect(c).toBeLessThanOrEqual(60);
    }
  });

  it('gives the fast of a slow (1 s) and a fast (10 ms) replica at least 80 % of 8 concurrent clients for 10 s', async () => {
    const reps = [r['slow']!, r['fast']!];
    const before = reps.map((x) => x.got.length);
    const answered = new Map<string, number>();
    const clients = Array.from({ length: 8 }, () => new KeepAliveClient(t.httpPort, domain('share'), 1));
    const until = Date.now() + 10_000;
    try {
      await Promise.all(
        clients.map(async (c) => {
          while (Date.now() < until) {
            const x = await c.request('/work');
            const k = x.status === 200 ? x.replica : `status ${x.status}`;
            answered.set(k, (answered.get(k) ?? 0) + 1);
          }
        }),
      );
    } finally {
      for (const c of clients) c.close();
    }
    const [slow, fast] = countsSince(reps, before) as [number, number];
    console.log(
      `[balancing] slow/fast over 10 s, 8 clients: ${JSON.stringify(Object.fromEntries(answered))}; fast share ${((100 * fast) / (slow + fast)).toFixed(1)} %`,
    );
    expect([...answered.keys()].sort()).toEqual(['fast', 'slow'].filter((n) => answered.has(n)).sort());
    expect(fast + slow).toBe((answered.get('fast') ?? 0) + (answered.get('slow') ?? 0));
    expect(slow).toBeGreaterThan(0); // the slow one is in rotation, not shut out
    expect(fast / (slow + fast)).toBeGreaterThanOrEqual(0.8);
  }, 30_000);

  it('sends requests to a replica added by PUT on the connections a client already holds, without a reload', async () => {
    const [g1, g2] = [r['grow-1']!, r['grow-2']!];
    const client = new KeepAliveClient(t.httpPort, domain('grow'), 2);
    let stop = false;
    const traffic = (async () => {
      const out: KeptReply[] = [];
      while (!stop) out.push(...(await Promise.all([client.request('/bg'), client.request('/bg')])));
      return out;
    })();
    try {
      await eventually(() => (g1.got.length >= 20 ? true : undefined), 15_000);
      const held = [...client.sockets];
      const reloadsBefore = t.gw.nginxStats.reloads;
      const metricBefore = await reloads();
      services.set('grow', [directReplica('g1', g1.port), directReplica('g2', g2.port)]);
      const t0 = Date.now();
      await put();
      const putMs = Date.now() - t0;
      await eventually(() => (g2.got.length > 0 ? true : undefined), 15_000);
      const firstMs = Date.now() - t0;
      const afterPutMs = firstMs - putMs;
      stop = true;
      const bg = await traffic;
      expect(bg.filter((x) => x.status !== 200)).toEqual([]);

      const before = [g1.got.length, g2.got.length];
      const next: KeptReply[] = [];
      for (let i = 0; i < 50; i++) next.push(await client.request(`/next/${i}`));
      const counts = countsSince([g1, g2], before);
      console.log(
        `[balancing] added replica: PUT took ${putMs} ms, first request at it ${firstMs} ms after the PUT started (${afterPutMs} ms after it returned); ` +
          `next 50 sequential requests: ${counts.join(' / ')}`,
      );
      expect(next.filter((x) => x.status !== 200)).toEqual([]);
      expect(counts[1]).toBeGreaterThanOrEqual(10);
      expect(counts[0]).toBeGreaterThanOrEqual(10);
      // The same client connections all along: the change reached connections Nginx already held.
      expect(client.sockets.size).toBe(held.length);
      expect(held.every((sock) => client.sockets.has(sock) && !sock.destroyed)).toBe(true);
      expect(t.gw.nginxStats.reloads).toBe(reloadsBefore);
      expect(await reloads()).toBe(metricBefore);
    } finally {
      stop = true;
      await traffic.catch(() => undefined);
      client.close();
    }
  }, 45_000);

  it('sends no request to the old port of a replica once the PUT moving it returned', async () => {
    const [old, moved] = [r['moving-old']!, r['moving-new']!];
    // Connections held from before the change: Nginx's to the balancer, the balancer's to the old port.
    const client = new KeepAliveClient(t.httpPort, domain('moving'), 4);
    try {
      const warm = await Promise.all(Array.from({ length: 8 }, () => client.request('/warm')));
      expect(warm.map((x) => x.replica)).toEqual(Array(8).fill('moving-old'));
      services.set('moving', [directReplica('m', moved.port)]);
      await put();
      const oldCount = old.got.length;
      await eventually(allReady, 15_000);
      const replies: KeptReply[] = [];
      for (let i = 0; i < 20; i++) replies.push(await client.request(`/after/${i}`));
      replies.push(...(await Promise.all(Array.from({ length: 20 }, (_, i) => client.request(`/after-par/${i}`)))));
      const fresh = new KeepAliveClient(t.httpPort, domain('moving'), 1);
      try {
        for (let i = 0; i < 10; i++) replies.push(await fresh.request(`/fresh/${i}`));
      } finally {
        fresh.close();
      }
      expect(replies.map((x) => `${x.status} ${x.replica}`)).toEqual(Array(50).fill('200 moving-new'));
      expect(old.got.slice(oldCount)).toEqual([]);
    } finally {
      client.close();
    }
  });
});
