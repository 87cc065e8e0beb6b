// The in-server proxy on the data plane (startServerProxy, its SSH loop, a real sshd, real HTTP
// replicas on 127.0.0.1): requests are balanced per request, not per client connection; a
// WebSocket stays on the replica it was given; an event stream is relayed as it comes; a replica
// that hangs up before answering costs a GET nothing and a POST a 502; no Ready replica is
// dstack's 503 on /proxy/services and a 503 (not a 500) on the model API.

import { Agent } from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { request as httpRequest } from 'node:http';
import { WebSocket } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../helpers/ports.js';
import { startSshdChain, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { eventually } from '../helpers/nginx.js';
import { send, startHarness, untilStatus, type Harness } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

let h: Harness;
let direct: TestReplica;
let tunnelled: TestReplica;
let good: TestReplica;
let sshd: TestSshd;
let stop: () => Promise<void>;
/** Accepts, reads the request, closes without a byte of answer; counts the requests it dropped. */
let hangUp: { server: Server; port: number; dropped: number };
const scratch = tmpDir('dp-sp-balance-');
let ssh: Record<string, unknown>;
let doc: { apiVersion: string; kind: string; spec: { projects: unknown[]; services: unknown[] } };

async function startHangUp(): Promise<typeof hangUp> {
  const sockets = new Set<Socket>();
  const state = { server: createServer(), port: 0, dropped: 0 };
  state.server.on('connection', (s) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    s.once('data', () => {
      state.dropped++;
      s.destroy();
    });
  });
  state.server.on('close', () => sockets.forEach((s) => s.destroy()));
  await new Promise<void>((resolve) => state.server.listen(0, '127.0.0.1', resolve));
  state.port = (state.server.address() as { port: number }).port;
  return state;
}

const paths = (r: TestReplica, prefix: string): string[] => r.seen.filter((p) => p.startsWith(prefix));

beforeAll(async () => {
  [direct, tunnelled, good, hangUp] = await Promise.all([startReplica(), startReplica(), startReplica(), startHangUp()]);
  const chain = await startSshdChain(scratch.dir, 1);
  sshd = chain.sshds[0]!;
  stop = chain.stop;
  h = await startHarness(
    {},
    {
      ssh: { appHost: '127.0.0.1', probeIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } },
      authorize: async () => 'allow',
    },
  );
  ssh = { host: '127.0.0.1', port: sshd.port, user: sshd.user, hostKeyFingerprint: sshd.fingerprint() };
  doc = {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'p', sshPrivateKey: chain.key.privateKey }],
      services: [
        {
          project: 'p',
          run: 'two',
          auth: false,
          replicas: [
            { id: 'two-direct', appPort: direct.port, direct: { host: '127.0.0.1', port: direct.port } },
            { id: 'two-ssh', appPort: tunnelled.port, ssh },
          ],
        },
        {
          project: 'p',
          run: 'flaky',
          auth: false,
          replicas: [
            { id: 'flaky-hangs-up', appPort: hangUp.port, direct: { host: '127.0.0.1', port: hangUp.port } },
            { id: 'flaky-good', appPort: good.port, direct: { host: '127.0.0.1', port: good.port } },
          ],
        },
      ],
    },
  };
  await h.put(doc);
  await untilStatus(`${h.url}/proxy/services/p/two/echo`, 200, 20_000);
  await eventually(
    () => (h.proxy.ssh.replicas.loads().filter((l) => l.service === 'p/two' && l.ready).length === 2 ? true : undefined),
    20_000,
  );
}, 60_000);

afterAll(async () => {
  await h?.close();
  await Promise.all([direct?.close(), tunnelled?.close(), good?.close()]);
  hangUp?.server.close();
  await stop?.();
  scratch.cleanup();
});

describe('per-request balancing through the in-server proxy', () => {
  it('spreads 100 sequential requests on one keep-alive connection over a direct and an SSH replica', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    let accepted = 0;
    const onConnection = (): void => void accepted++;
    h.proxy.app.server.on('connection', onConnection);
    try {
      for (let i = 0; i < 100; i++) {
        const r = await send(`${h.url}/proxy/services/p/two/bal/${i}`, { agent });
        expect(r.status).toBe(200);
        expect(r.json<{ url: string }>().url).toBe(`/bal/${i}`);
      }
    } finally {
      h.proxy.app.server.off('connection', onConnection);
      agent.destroy();
    }
    expect(accepted).toBe(1); // one client connection for all of them
    const a = paths(direct, '/bal/').length;
    const b = paths(tunnelled, '/bal/').length;
    expect(a + b).toBe(100);
    expect(a).toBeGreaterThanOrEqual(40);
    expect(a).toBeLessThanOrEqual(60);
    expect(b).toBeGreaterThanOrEqual(40);
    expect(b).toBeLessThanOrEqual(60);
    console.log(`100 sequential requests on one connection: direct ${a}, ssh ${b}`);
  });

  it('keeps a WebSocket on one replica for its whole life; HTTP requests meanwhile go to the less loaded one', async () => {
    const ws = new WebSocket(`${h.url.replace('http:', 'ws:')}/proxy/services/p/two/ws-pinned`);
    const inbox: string[] = [];
    let wake: (() => void) | null = null;
    ws.onmessage = (ev) => {
      inbox.push(String(ev.data));
      wake?.();
    };
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error('websocket error'));
    });
    const next = async (): Promise<string> => {
      while (inbox.length === 0) await new Promise<void>((resolve) => (wake = resolve));
      return inbox.shift()!;
    };
    const before = { direct: paths(direct, '/during/').length, tunnelled: paths(tunnelled, '/during/').length };
    for (let i = 0; i < 20; i++) {
      ws.send(`m${i}`);
      expect(await next()).toBe(`m${i}`);
      expect((await send(`${h.url}/proxy/services/p/two/during/${i}`)).status).toBe(200);
    }
    // Exactly one replica saw the upgrade; the data plane counts the open WebSocket there.
    const owners = [direct, tunnelled].filter((r) => r.seen.includes('/ws-pinned'));
    expect(owners).toHaveLength(1);
    const pinnedTo = owners[0] === direct ? 'two-direct' : 'two-ssh';
    const loads = h.proxy.ssh.replicas.loads().filter((l) => l.service === 'p/two');
    expect(loads.find((l) => l.replica === pinnedTo)?.inFlight).toBe(1);
    expect(loads.find((l) => l.replica !== pinnedTo)?.inFlight).toBe(0);
    // The HTTP requests meanwhile: the WebSocket's replica holds one in flight, so the other one
    // is the less loaded and takes them all.
    const during = {
      direct: paths(direct, '/during/').length - before.direct,
      tunnelled: paths(tunnelled, '/during/').length - before.tunnelled,
    };
    expect(pinnedTo === 'two-direct' ? during.tunnelled : during.direct).toBe(20);
    ws.close();
    await eventually(() => (h.proxy.ssh.replicas.loads().every((l) => l.service !== 'p/two' || l.inFlight === 0) ? true : undefined));
  });

  it('relays an event stream chunk by chunk', async () => {
    const { status, first, rest } = await new Promise<{ status: number; first: string; rest: Promise<string> }>((resolve, reject) => {
      const u = new URL(`${h.url}/proxy/services/p/two/sse`);
      const req = httpRequest({ host: u.hostname, port: u.port, path: u.pathname, agent: false }, (res) => {
        res.setEncoding('utf8');
        res.once('data', (chunk: string) => {
          let tail = '';
          const rest = new Promise<string>((done, fail) => {
            res.on('data', (c: string) => (tail += c));
            res.on('end', () => done(tail));
            res.on('error', fail);
          });
          resolve({ status: res.statusCode ?? 0, first: chunk, rest });
        });
      });
      req.on('error', reject);
      req.end();
    });
    // The first event arrived while the replica still holds back the second.
    expect(status).toBe(200);
    expect(first).toBe('data: 1\n\n');
    direct.release();
    tunnelled.release();
    expect(await rest).toBe('data: 2\n\n');
  });
});

describe('a replica that closes the connection before answering', () => {
  it('costs an idempotent GET nothing: it is answered by the other replica', async () => {
    const dropped = hangUp.dropped;
    for (let i = 0; i < 20; i++) {
      const r = await send(`${h.url}/proxy/services/p/flaky/get/${i}`);
      expect(r.status).toBe(200);
      expect(r.json<{ url: string }>().url).toBe(`/get/${i}`);
    }
    expect(hangUp.dropped).toBeGreaterThan(dropped); // some were sent there first, and resent
    expect(paths(good, '/get/')).toHaveLength(20);
  });

  it('gives a POST a 502 rather than sending it twice', async () => {
    const dropped = hangUp.dropped;
    const statuses: number[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await send(`${h.url}/proxy/services/p/flaky/post/${i}`, { method: 'POST', body: `body ${i}` });
      statuses.push(r.status);
      if (r.status === 502) expect(r.json()).toEqual({ detail: 'Error requesting upstream' });
    }
    const failed = statuses.filter((s) => s === 502).length;
    expect(failed).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 200).length + failed).toBe(20);
    // Each 502 is one POST the replica dropped, and none of them reached the other replica.
    expect(hangUp.dropped - dropped).toBe(failed);
    expect(paths(good, '/post/')).toHaveLength(20 - failed);
  });
});

describe('no Ready replica', () => {
  it('is 503 with dstack text on /proxy/services, and a 503 on the model API', async () => {
    const deadSsh = await freePort();
    doc.spec.services.push({
      project: 'p',
      run: 'r',
      auth: false,
      model: { name: 'p/model', format: 'openai', prefix: '/v1' },
      // No sshd listens there: the replica never becomes Ready.
      replicas: [{ id: 'r-down', appPort: 8000, ssh: { ...ssh, port: deadSsh } }],
    });
    await h.put(doc);
    const r = await untilStatus(`${h.url}/proxy/services/p/r/anything`, 503);
    expect(r.json()).toEqual({ detail: 'Service p/r has no ready replica' });

    const m = await send(`${h.url}/proxy/models/p/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer t' },
      body: JSON.stringify({ model: 'p/model', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(m.status).toBe(503);
    expect(m.json()).toMatchObject({ detail: 'Service p/r has no ready replica', error: { type: 'upstream_error', code: 503 } });
  });
});
