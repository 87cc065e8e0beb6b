// Replicas that misbehave behind the gateway's per-request balancer (real Nginx, replicas
// scripted on raw TCP on 127.0.0.1): an answer framed two ways at once is refused with 502 and
// its upstream connection is dropped, not reused; a replica that closes the connection without
// answering costs an idempotent GET nothing (it is retried on the other replica) while a POST
// gets 502.

import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KeepAliveClient, replicaReady, startNamedReplica, type NamedReplica } from '../helpers/balancing.js';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { directReplica, integrationDoc, startGatewayWith, type ReplicaDoc, type ServiceDoc } from './integration-harness.js';

let t: TestGateway;
const services = new Map<string, ReplicaDoc[]>();
const domain = (run: string): string => `${run}.bal.test`;

/** Each request the framing replica got: its target and the connection it came on. */
const framingSeen: { target: string; socket: Socket }[] = [];
const framingSockets = new Set<Socket>();
/** Sockets that closed, and whether the replica itself closed them (it never does). */
const framingClosed = new Set<Socket>();
let framing: Awaited<ReturnType<typeof startScriptedReplica>>;

/** Each request the dying replica got (it closes the connection instead of answering). */
const dyingSeen: string[] = [];
let dying: Awaited<ReturnType<typeof startScriptedReplica>>;
let good: NamedReplica;

async function allReady(): Promise<true | undefined> {
  const s = await api(t, { path: '/api/v1/status' });
  for (const [run, replicas] of services) for (const x of replicas) if (!replicaReady(s.json, `main/${run}/${x.id}`)) return undefined;
  return true;
}

beforeAll(async () => {
  framing = await startScriptedReplica((socket, _nth, head) => {
    const target = head.split(' ')[1] ?? '';
    framingSeen.push({ target, socket });
    // Content-Length and chunked at once: which of the two frames the answer is ambiguous.
    if (target === '/te-cl')
      return void socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n');
    const body = `real:${target}`;
    socket.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\nX-Replica: framing\r\n\r\n${body}`);
  });
  framing.server.on('connection', (s: Socket) => {
    framingSockets.add(s);
    s.once('close', () => framingClosed.add(s));
  });
  dying = await startScriptedReplica((socket, _nth, head) => {
    dyingSeen.push(head.split(' ', 1)[0] ?? '');
    socket.destroy();
  });
  good = await startNamedReplica('good');
  t = await startGatewayWith();
  services.set('framing', [directReplica('f', framing.port)]);
  services.set('dying', [directReplica('bad', dying.port), directReplica('good', good.port)]);
  const doc = integrationDoc({ services: [...services].map(([run, replicas]): ServiceDoc => ({ run, domain: domain(run), replicas })) });
  const res = await putState(t, doc);
  expect(res.status, res.body).toBe(200);
  await eventually(allReady, 30_000);
  const probe = new KeepAliveClient(t.httpPort, domain('framing'), 1);
  try {
    await eventually(async () => ((await probe.request('/ready')).status === 200 ? true : undefined), 30_000);
  } finally {
    probe.close();
  }
}, 60_000);

afterAll(async () => {
  for (const s of framingSockets) s.destroy();
  await new Promise((resolve) => framing?.server.close(resolve));
  await new Promise((resolve) => dying?.server.close(resolve));
  await good?.close();
  await t?.cleanup();
}, 60_000);

describe('misbehaving replicas behind the per-request balancer', () => {
  it('answers 502 to a reply with both Content-Length and chunked, and drops that upstream connection', async () => {
    const client = new KeepAliveClient(t.httpPort, domain('framing'), 1);
    try {
      // A pooled upstream connection first, so there is one the bad answer could be followed on.
      expect((await client.request('/before')).body).toBe('real:/before');
      const bad = await client.request('/te-cl');
      expect(bad.status).toBe(502);
      const used = framingSeen.find((x) => x.target === '/te-cl')!.socket;
      // The replica sees that connection closed: nothing after an ambiguous answer is trusted.
      await eventually(() => (framingClosed.has(used) ? true : undefined), 10_000);
      const after = await client.request('/after');
      expect(after).toMatchObject({ status: 200, body: 'real:/after' });
      expect(framingSeen.find((x) => x.target === '/after')!.socket).not.toBe(used);
    } finally {
      client.close();
    }
  });

  it('retries a GET the replica dropped unanswered on the other replica', async () => {
    const client = new KeepAliveClient(t.httpPort, domain('dying'), 1);
    const dyingBefore = dyingSeen.length;
    const goodBefore = good.got.length;
    try {
      const replies = [];
      for (let i = 0; i < 20; i++) replies.push(await client.request(`/get/${i}`));
      expect(replies.map((x) => `${x.status} ${x.replica}`)).toEqual(Array(20).fill('200 good'));
    } finally {
      client.close();
    }
    // Ties are broken at random: with 20 requests the dropping replica was tried (2^-20 it was not).
    expect(dyingSeen.slice(dyingBefore).filter((m) => m === 'GET').length).toBeGreaterThan(0);
    expect(good.got.length - goodBefore).toBe(20);
    console.log(`[balancing] 20 GETs: the dropping replica got ${dyingSeen.length - dyingBefore}, all answered by the other`);
  });

  it('answers 502 to a POST the replica dropped unanswered, without sending it elsewhere', async () => {
    const client = new KeepAliveClient(t.httpPort, domain('dying'), 1);
    const dyingBefore = dyingSeen.length;
    const goodBefore = good.got.filter((x) => x.method === 'POST').length;
    const statuses: string[] = [];
    try {
      for (let i = 0; i < 20; i++) {
        const x = await client.request(`/post/${i}`, 'POST', `{"n":${i}}`);
        statuses.push(x.status === 200 ? `200 ${x.replica}` : String(x.status));
      }
    } finally {
      client.close();
    }
    const failed = statuses.filter((s) => s === '502').length;
    const postsAtDying = dyingSeen.slice(dyingBefore).filter((m) => m === 'POST').length;
    const postsAtGood = good.got.filter((x) => x.method === 'POST').length - goodBefore;
    console.log(`[balancing] 20 POSTs: ${failed} got 502, the dropping replica saw ${postsAtDying}, the other ${postsAtGood}`);
    expect(statuses.filter((s) => s !== '502' && s !== '200 good')).toEqual([]);
    expect(failed).toBeGreaterThan(0);
    // A POST that reached the dropping replica was not also sent to the good one.
    expect(postsAtGood).toBe(20 - failed);
    expect(postsAtDying).toBeGreaterThanOrEqual(failed);
  });
});
