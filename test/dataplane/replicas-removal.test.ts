// Requests queued in a removed replica's pool (its connections all busy, nothing of them written)
// are chosen for again among the replicas left, or answered 503 when none is; the request in
// flight on it finishes. Real HTTP replicas on 127.0.0.1, one connection per replica so that
// requests queue.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { Readable, type Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { statusFor } from '../../src/dataplane/errors.js';
import { Replicas, type Upstream } from '../../src/dataplane/replicas.js';
import type { Http1Request } from '../../src/http1/index.js';

const SVC = 'proj/svc';

interface Answer {
  status?: number;
  body: string;
  error?: Error;
}

function send(rs: Replicas, req: Partial<Http1Request> = {}): Promise<Answer> {
  const out: Answer = { body: '' };
  return new Promise((resolve) => {
    rs.dispatch(
      SVC,
      { method: 'GET', path: '/', headers: ['host', 'svc'], ...req },
      {
        onResponseStart: (status) => void (out.status = status),
        onResponseData: (chunk) => ((out.body += chunk.toString()), true),
        onResponseEnd: () => resolve(out),
        onResponseError: (err) => resolve({ ...out, error: err }),
      },
    );
  });
}

interface TestReplica {
  name: string;
  upstream: Upstream;
  /** Every request it got: method, path and body. */
  got: string[];
  held: ServerResponse[];
  release(): void;
}

const servers: Server[] = [];
const books: Replicas[] = [];

afterEach(async () => {
  for (const rs of books.splice(0)) await rs.close();
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
});

/** A replica that holds its first `hold` requests until release(), then answers at once. */
async function replica(name: string, hold: number): Promise<TestReplica> {
  let port = 0;
  const t: TestReplica = {
    name,
    got: [],
    held: [],
    release: () => {
      for (const res of t.held.splice(0)) res.end(`${name}:held`);
    },
    upstream: {
      isReady: () => true,
      open: () =>
        new Promise<Duplex>((resolve, reject) => {
          const s: Socket = netConnect({ host: '127.0.0.1', port });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        }),
    },
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      t.got.push(`${req.method} ${req.url} ${Buffer.concat(chunks).toString()}`.trim());
      if (t.got.length <= hold) t.held.push(res);
      else res.end(name);
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as { port: number }).port;
  return t;
}

function book(): Replicas {
  const rs = new Replicas({ keepAliveTimeoutMs: 2_000, connectionsPerReplica: 1 });
  books.push(rs);
  return rs;
}

async function until(f: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

const inFlight = (rs: Replicas, name: string, draining = false): number | undefined =>
  rs.loads().find((l) => l.replica === name && l.draining === draining)?.inFlight;

describe('requests queued on a replica when it is removed', () => {
  it('go to the replicas left, a streamed POST too; the one in flight on it finishes there', async () => {
    const a = await replica('a', 1);
    const b = await replica('b', 1);
    const rs = book();
    rs.set(SVC, 'a', a.upstream);
    rs.set(SVC, 'b', b.upstream);
    const onA = send(rs, { path: '/first-a' });
    const onB = send(rs, { path: '/first-b' });
    await until(() => a.held.length === 1 && b.held.length === 1, 'a and b to hold one each');
    // Both connections busy: the next ones queue, alternately on a and b.
    const queued = [
      send(rs, { path: '/q1' }),
      send(rs, { path: '/q2' }),
      send(rs, {
        method: 'POST',
        path: '/q3',
        headers: ['host', 'svc', 'content-length', '6'],
        body: Readable.from([Buffer.from('str'), Buffer.from('eam')]),
      }),
      send(rs, { path: '/q4' }),
    ];
    expect(inFlight(rs, 'a')).toBe(3);
    expect(inFlight(rs, 'b')).toBe(3);

    rs.remove(SVC, 'a');
    expect(inFlight(rs, 'a', true)).toBe(1); // only the one written to it
    expect(inFlight(rs, 'b')).toBe(5);
    a.release();
    expect(await onA).toMatchObject({ status: 200, body: 'a:held' });
    b.release();
    expect(await onB).toMatchObject({ status: 200, body: 'b:held' });
    const answers = await Promise.all(queued);
    expect(answers.map((x) => `${x.status} ${x.body}`)).toEqual(Array(4).fill('200 b'));
    expect(a.got).toEqual(['GET /first-a']);
    expect(b.got.sort()).toEqual(['GET /first-b', 'GET /q1', 'GET /q2', 'GET /q4', 'POST /q3 stream'].sort());
    await rs.drain(a.upstream, 10_000);
    expect(rs.loads()).toMatchObject([{ replica: 'b', inFlight: 0 }]);
  });

  it('with no replica left, are answered DP_ERR_NO_READY_REPLICA (503) at once', async () => {
    const a = await replica('a', 1);
    const rs = book();
    rs.set(SVC, 'a', a.upstream);
    const first = send(rs, { path: '/first' });
    await until(() => a.held.length === 1, 'a to hold the first');
    const queued = [send(rs, { path: '/q1' }), send(rs, { path: '/q2' })];
    rs.remove(SVC, 'a');
    for (const q of await Promise.all(queued)) {
      expect(q.status).toBeUndefined();
      expect(statusFor(q.error, SVC)).toMatchObject({ status: 503, code: 'DP_ERR_NO_READY_REPLICA' });
    }
    expect(inFlight(rs, 'a', true)).toBe(1);
    a.release();
    expect(await first).toMatchObject({ status: 200, body: 'a:held' });
    expect(a.got).toEqual(['GET /first']);
  });

  it('go to the replacement when the id is set again with a new address', async () => {
    const old = await replica('old', 1);
    const moved = await replica('moved', 0);
    const rs = book();
    rs.set(SVC, 'r', old.upstream);
    const first = send(rs, { path: '/first' });
    await until(() => old.held.length === 1, 'old to hold the first');
    const queued = [send(rs, { path: '/q1' }), send(rs, { path: '/q2' })];
    rs.set(SVC, 'r', moved.upstream);
    expect((await Promise.all(queued)).map((x) => x.body)).toEqual(['moved', 'moved']);
    old.release();
    expect((await first).body).toBe('old:held');
    expect(old.got).toEqual(['GET /first']);
  });
});
