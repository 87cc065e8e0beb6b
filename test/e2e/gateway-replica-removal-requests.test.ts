// After a replica leaves the document it gets no new request, through the real gateway (client →
// Nginx, keep-alive both ways → the service's balancer socket → per-request choice): not the
// requests a client keeps sending on connections Nginx already holds, not the requests already
// queued on the removed replica's pool (its one connection busy), which go to the replica left;
// a request in flight on it at removal completes there.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answersFrom, KeepAliveClient, type KeptReply } from '../helpers/balancing.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { holdingReplica, sendAlone, type HoldingReplica } from '../helpers/holding-replica.js';
import { eventually } from '../helpers/nginx.js';
import { directReplica, integrationDoc, startGatewayWith, type ReplicaDoc, type ServiceDoc } from './integration-harness.js';

let t: TestGateway;
const r: Record<string, HoldingReplica> = {};
const services = new Map<string, ReplicaDoc[]>();
const domain = (run: string): string => `${run}.removal.test`;

async function put(): Promise<void> {
  const doc = integrationDoc({ services: [...services].map(([run, replicas]): ServiceDoc => ({ run, domain: domain(run), replicas })) });
  const res = await putState(t, doc); // returns once the controller acted on it
  expect(res.status, res.body).toBe(200);
}

const inFlight = (run: string, id: string): number | undefined =>
  t.gw.ssh.replicas.loads().find((l) => l.service === `main/${run}` && l.replica === id && !l.draining)?.inFlight;

beforeAll(async () => {
  r['a'] = await holdingReplica('a', true);
  r['b'] = await holdingReplica('b', false);
  r['qa'] = await holdingReplica('qa', true);
  r['qb'] = await holdingReplica('qb', true);
  // One connection per replica, so that requests queue on a replica whose connection is busy.
  t = await startGatewayWith({}, { ssh: { replicas: { connectionsPerReplica: 1 } } });
  services.set('live', [directReplica('a', r['a']!.port), directReplica('b', r['b']!.port)]);
  services.set('queued', [directReplica('qa', r['qa']!.port), directReplica('qb', r['qb']!.port)]);
  await put();
  await answersFrom(t.httpPort, domain('live'), ['a', 'b']);
  await answersFrom(t.httpPort, domain('queued'), ['qa', 'qb']);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  for (const x of Object.values(r)) await x.close();
});

describe('a replica removed from the document', () => {
  it('gets none of the requests a keep-alive client sends after the removal; its request in flight completes', async () => {
    const [a, b] = [r['a']!, r['b']!];
    const client = new KeepAliveClient(t.httpPort, domain('live'), 2);
    let removed = false;
    let stop = false;
    const replies: { after: boolean; reply: KeptReply }[] = [];
    const traffic = (async () => {
      for (let i = 0; !stop; i++) {
        const after = removed;
        const tag = after ? 'after' : 'before';
        const pair = await Promise.all([client.request(`/bg/${tag}/${i}/0`), client.request(`/bg/${tag}/${i}/1`)]);
        for (const reply of pair) replies.push({ after, reply });
      }
    })();
    try {
      await eventually(() => (a.got.filter((p) => p.startsWith('/bg/')).length >= 10 ? true : undefined), 15_000);
      // A request in flight on `a` at removal: b answers /hold at once, so send until a holds one.
      // (With a's one connection busy, a request of the traffic may queue behind it meanwhile.)
      let inFlightOnA: Promise<KeptReply> | undefined;
      await eventually(async () => {
        const p = sendAlone(t.httpPort, domain('live'), '/hold');
        const first = await Promise.race([p, eventually(() => (a.held.length > 0 ? 'held' : undefined), 15_000)]);
        if (first !== 'held') return undefined;
        inFlightOnA = p;
        return true;
      }, 15_000);
      const held = [...client.sockets];
      services.set('live', [directReplica('b', b.port)]);
      await put();
      removed = true;
      await eventually(() => (replies.filter((x) => x.after).length >= 60 ? true : undefined), 30_000);
      stop = true;
      await traffic;
      const after = replies.filter((x) => x.after).map((x) => x.reply);
      const before = replies.filter((x) => !x.after).map((x) => x.reply);
      console.log(
        `[removal] keep-alive traffic: ${before.length} requests before the removal (a ${before.filter((x) => x.replica === 'a').length}), ` +
          `${after.length} after it (a ${after.filter((x) => x.replica === 'a').length}) on ${client.sockets.size} client connections`,
      );
      expect(replies.filter((x) => x.reply.status !== 200)).toEqual([]);
      expect(after.map((x) => x.replica)).toEqual(Array(after.length).fill('b'));
      expect(a.got.filter((p) => p.startsWith('/bg/after/'))).toEqual([]);
      // The same client connections all along: the removal reached connections Nginx already held.
      expect(held.every((s) => client.sockets.has(s) && !s.destroyed)).toBe(true);
      // The request in flight on `a` since before the removal is answered there.
      expect(inFlightOnA).toBeDefined();
      a.release();
      expect(await inFlightOnA!).toEqual({ status: 200, replica: 'a', body: 'a:held' });
    } finally {
      stop = true;
      await traffic.catch(() => undefined);
      client.close();
      a.release();
    }
  }, 90_000);

  it('sends the requests queued on it (its connection busy, nothing written) to the replica left', async () => {
    const [qa, qb] = [r['qa']!, r['qb']!];
    // One held request on each: each replica's only connection is busy.
    const first = [sendAlone(t.httpPort, domain('queued'), '/hold/1'), sendAlone(t.httpPort, domain('queued'), '/hold/2')];
    await eventually(() => (qa.held.length === 1 && qb.held.length === 1 ? true : undefined), 15_000);
    // Four more queue, two on each replica's pool.
    const queued = Array.from({ length: 4 }, (_, i) => sendAlone(t.httpPort, domain('queued'), `/queued/${i}`));
    await eventually(() => (inFlight('queued', 'qa') === 3 && inFlight('queued', 'qb') === 3 ? true : undefined), 15_000);
    const qaGot = qa.got.length;

    services.set('queued', [directReplica('qb', qb.port)]);
    await put();
    expect(inFlight('queued', 'qb')).toBe(5);
    qb.release(); // its connection free again: the queued ones, its own and qa's, go out on it
    const answers = await Promise.all(queued);
    expect(answers.map((x) => `${x.status} ${x.replica}`)).toEqual(Array(4).fill('200 qb'));
    expect(qb.got.filter((p) => p.startsWith('/queued/')).sort()).toEqual(['/queued/0', '/queued/1', '/queued/2', '/queued/3']);
    // The removed replica's request in flight completes; it never got a queued one.
    qa.release();
    const held = await Promise.all(first);
    expect(held.map((x) => x.status)).toEqual([200, 200]);
    expect(held.map((x) => x.replica).sort()).toEqual(['qa', 'qb']);
    expect(qa.got.slice(qaGot)).toEqual([]);
    expect(qa.got.filter((p) => p.startsWith('/queued/'))).toEqual([]);
  }, 60_000);
});
