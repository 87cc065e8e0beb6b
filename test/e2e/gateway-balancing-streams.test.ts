// Long answers through the gateway's per-request balancer (real Nginx, direct replicas on
// 127.0.0.1): a streamed answer outlives the removal of its replica, a WebSocket stays on the
// replica that accepted it while plain requests are spread, and an SSE stream is relayed event
// by event, not buffered.

import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  KeepAliveClient,
  openWebSocket,
  startNamedReplica,
  type NamedReplica,
  allReplicasReady,
  answersFrom as answersFromAll,
} from '../helpers/balancing.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { directReplica, integrationDoc, startGatewayWith, type ReplicaDoc, type ServiceDoc } from './integration-harness.js';

let t: TestGateway;
const r: Record<string, NamedReplica> = {};
const services = new Map<string, ReplicaDoc[]>();

const domain = (run: string): string => `${run}.bal.test`;
const rep = (name: string): NamedReplica => r[name]!;

async function put(): Promise<void> {
  const doc = integrationDoc({ services: [...services].map(([run, replicas]): ServiceDoc => ({ run, domain: domain(run), replicas })) });
  const res = await putState(t, doc);
  expect(res.status, res.body).toBe(200);
}

const allReady = (): Promise<true | undefined> => allReplicasReady(t, services);

/** Waits until `run` answers 200 from every replica named in `names`. */
const answersFrom = (run: string, names: string[]): Promise<void> => answersFromAll(t.httpPort, domain(run), names);

interface Streamed {
  status: number;
  headers: IncomingHttpHeaders;
  /** Resolves with the whole body once the answer ended; rejects if it was cut. */
  body: Promise<string>;
  /** What arrived so far. */
  received: () => string;
}

/** A GET on its own connection that resolves at the response head and collects the body as it comes. */
function stream(host: string, path: string): Promise<Streamed> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port: t.httpPort, path, agent: false, headers: { host } });
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      const body = new Promise<string>((ok, fail) => {
        res.on('end', () => (res.complete ? ok(text) : fail(new Error(`answer cut after ${JSON.stringify(text)}`))));
        res.on('error', fail);
        res.on('aborted', () => fail(new Error(`answer aborted after ${JSON.stringify(text)}`)));
      });
      body.catch(() => undefined);
      resolve({ status: res.statusCode ?? 0, headers: res.headers, body, received: () => text });
    });
    req.on('error', reject);
    req.end();
  });
}

beforeAll(async () => {
  for (const name of ['drain-1', 'drain-2', 'ws-1', 'ws-2', 'sse']) r[name] = await startNamedReplica(name);
  // A drain period well past the streamed answer: the answer must not depend on it being cut short.
  t = await startGatewayWith({ drainPeriod: '30' });
  services.set('drain', [directReplica('d1', rep('drain-1').port), directReplica('d2', rep('drain-2').port)]);
  services.set('ws', [directReplica('w1', rep('ws-1').port), directReplica('w2', rep('ws-2').port)]);
  services.set('sse', [directReplica('s', rep('sse').port)]);
  await put();
  await eventually(allReady, 30_000);
  await answersFrom('drain', ['drain-1', 'drain-2']);
  await answersFrom('ws', ['ws-1', 'ws-2']);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  for (const x of Object.values(r)) await x.close();
});

describe('long answers through the per-request balancer', () => {
  it('completes a 3 s streamed answer of a replica removed meanwhile; the next requests go to the other', async () => {
    const s = await stream(domain('drain'), '/stream?chunks=10&every=300');
    expect(s.status).toBe(200);
    const name = String(s.headers['x-replica']);
    expect(['drain-1', 'drain-2']).toContain(name);
    const other = name === 'drain-1' ? 'drain-2' : 'drain-1';
    await eventually(() => (s.received().length > 0 ? true : undefined), 10_000);
    services.set('drain', [directReplica(other === 'drain-1' ? 'd1' : 'd2', rep(other).port)]);
    const t0 = Date.now();
    await put();
    const putMs = Date.now() - t0;
    // Still streaming when the PUT returned: the removal did not wait for it, nor cut it.
    const body = await s.body;
    expect(body).toBe(Array.from({ length: 10 }, (_, i) => `${name} ${i}\n`).join(''));
    console.log(`[balancing] PUT removing the streaming replica returned in ${putMs} ms; its 3 s answer completed intact`);

    const removedCount = rep(name).got.length;
    const client = new KeepAliveClient(t.httpPort, domain('drain'), 2);
    try {
      const replies = [];
      for (let i = 0; i < 20; i++) replies.push(await client.request(`/after/${i}`));
      expect(replies.map((x) => `${x.status} ${x.replica}`)).toEqual(Array(20).fill(`200 ${other}`));
    } finally {
      client.close();
    }
    expect(rep(name).got.length).toBe(removedCount);
  }, 30_000);

  it('keeps each WebSocket on the replica that accepted it while plain requests are spread', async () => {
    const reps = [rep('ws-1'), rep('ws-2')];
    const upgradesBefore = reps.map((x) => x.upgrades);
    const sockets = await Promise.all(Array.from({ length: 4 }, () => openWebSocket(t.httpPort, domain('ws'))));
    const client = new KeepAliveClient(t.httpPort, domain('ws'), 1);
    const plain = new Map<string, number>();
    try {
      for (let round = 0; round < 10; round++) {
        for (const [i, ws] of sockets.entries()) expect(await ws.echo(`m${i}-${round}`)).toBe(`${ws.replica}:m${i}-${round}`);
        for (let k = 0; k < 3; k++) {
          const x = await client.request('/plain');
          plain.set(x.replica, (plain.get(x.replica) ?? 0) + 1);
        }
      }
    } finally {
      client.close();
      for (const ws of sockets) ws.close();
    }
    const upgrades = reps.map((x, i) => x.upgrades - upgradesBefore[i]!);
    // Each replica accepted exactly the WebSockets that name it: none moved, none was opened twice.
    expect(upgrades).toEqual(reps.map((x) => sockets.filter((ws) => ws.replica === x.name).length));
    // Meanwhile plain requests on one keep-alive connection reached both replicas.
    expect(plain.get('ws-1') ?? 0).toBeGreaterThan(0);
    expect(plain.get('ws-2') ?? 0).toBeGreaterThan(0);
    console.log(
      `[balancing] WebSockets on ${sockets.map((ws) => ws.replica).join(', ')}; plain requests meanwhile ${JSON.stringify(Object.fromEntries(plain))}`,
    );
  }, 30_000);

  it('relays an SSE stream event by event: each arrives before the replica sends the next', async () => {
    const sse = rep('sse');
    const opening = stream(domain('sse'), '/sse');
    // The first event goes out as soon as the replica has the request (its head may travel with it).
    await eventually(() => (sse.sseSend('event-0') ? true : undefined), 10_000);
    const s = await opening;
    expect(s.status).toBe(200);
    expect(String(s.headers['content-type'])).toContain('text/event-stream');
    let expected = 'data: event-0\n\n';
    await eventually(() => (s.received() === expected ? true : undefined), 10_000);
    for (let i = 1; i < 5; i++) {
      // The replica writes the next event only once the client has the previous one: a relay that
      // buffered the stream would never deliver it and the wait would time out.
      expect(sse.sseSend(`event-${i}`)).toBe(true);
      expected += `data: event-${i}\n\n`;
      await eventually(() => (s.received() === expected ? true : undefined), 10_000);
    }
    sse.sseEnd();
    expect(await s.body).toBe(expected);
  }, 30_000);

  it("relays a stream's response head before its first body byte", async () => {
    const sse = rep('sse');
    // An event stream whose first event comes late (a queued generation): the client sees the
    // 200 and its headers at once, not when the first event is written.
    const opening = stream(domain('sse'), '/sse');
    let headed = false;
    void opening.then(() => (headed = true)).catch(() => undefined);
    try {
      await eventually(() => (sse.got.at(-1)?.url === '/sse' && headed ? true : undefined), 10_000);
    } finally {
      await eventually(() => (sse.sseSend('late') ? true : undefined), 10_000);
      sse.sseEnd();
    }
    const s = await opening;
    expect(s.status).toBe(200);
    expect(await s.body).toBe('data: late\n\n');
  }, 30_000);
});
