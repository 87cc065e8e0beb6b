// The replicas and the per-request choice, against real HTTP replicas on 127.0.0.1: least
// outstanding requests, ties to the one chosen longest ago, Ready only, connect failures tried elsewhere, one resend of
// an idempotent request whose replica closed before answering, removal and drain, abort, and
// pinned streams — with the load books (inFlight, loads()) checked at every step.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { Readable, type Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { statusFor } from '../../src/dataplane/errors.js';
import { Replicas, type ReplicaLoad, type ReplicasOptions, type Upstream } from '../../src/dataplane/replicas.js';
import type { Http1Exchange, Http1Request } from '../../src/http1/index.js';
import { freePort } from '../helpers/ports.js';

const SVC = 'proj/svc';

interface Answer {
  status?: number;
  body: string;
  error?: Error;
}

/** One request through dispatch: its exchange, and its answer once it ended or failed. */
function send(rs: Replicas, req: Partial<Http1Request> = {}, key = SVC): { ex: Http1Exchange; done: Promise<Answer> } {
  const out: Answer = { body: '' };
  let finish!: (a: Answer) => void;
  const done = new Promise<Answer>((r) => (finish = r));
  let settled = 0;
  const ex = rs.dispatch(
    key,
    { method: 'GET', path: '/', headers: ['host', 'svc'], ...req },
    {
      onResponseStart(status) {
        out.status = status;
      },
      onResponseData(chunk) {
        out.body += chunk.toString();
        return true;
      },
      onResponseEnd() {
        settled++;
        expect(settled).toBe(1);
        finish(out);
      },
      onResponseError(err) {
        settled++;
        expect(settled).toBe(1);
        out.error = err;
        finish(out);
      },
    },
  );
  return { ex, done };
}

interface TestReplica {
  name: string;
  port: number;
  hits: number;
  bodies: string[];
  ready: boolean;
  upstream: Upstream;
  /** Requests held (not answered yet), in arrival order. */
  held: { req: IncomingMessage; res: ServerResponse }[];
  /** Answer every held request. */
  release(): void;
  /** Sockets the server saw close. */
  closedSockets: number;
  server: Server;
}

type Behaviour = 'answer' | 'hold' | 'close';

const servers: Server[] = [];
let books: Replicas[] = [];

afterEach(async () => {
  for (const rs of books) await rs.close();
  books = [];
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
});

function tcp(port: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    const s: Socket = netConnect({ host: '127.0.0.1', port });
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

async function replica(name: string, behaviour: Behaviour | (() => Behaviour) = 'answer'): Promise<TestReplica> {
  const t: TestReplica = {
    name,
    port: 0,
    hits: 0,
    bodies: [],
    ready: true,
    held: [],
    closedSockets: 0,
    release() {
      for (const h of t.held.splice(0)) h.res.end(`${name}:held`);
    },
    upstream: { isReady: () => t.ready, open: () => tcp(t.port) },
    server: createServer((req, res) => {
      t.hits++;
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        t.bodies.push(Buffer.concat(chunks).toString());
        const b = typeof behaviour === 'function' ? behaviour() : behaviour;
        if (b === 'close') req.socket.destroy();
        else if (b === 'hold') t.held.push({ req, res });
        else res.end(name);
      });
    }),
  };
  t.server.on('connection', (s: Socket) => s.on('close', () => t.closedSockets++));
  servers.push(t.server);
  await new Promise<void>((r) => t.server.listen(0, '127.0.0.1', r));
  t.port = (t.server.address() as { port: number }).port;
  return t;
}

function books_(o: ReplicasOptions = {}): Replicas {
  const rs = new Replicas({ keepAliveTimeoutMs: 2_000, ...o });
  books.push(rs);
  return rs;
}

function add(rs: Replicas, ...list: TestReplica[]): void {
  for (const t of list) rs.set(SVC, t.name, t.upstream);
}

function load(rs: Replicas, name: string, draining = false): ReplicaLoad | undefined {
  const all = rs.loads();
  for (const l of all) {
    expect(l.inFlight).toBeGreaterThanOrEqual(0);
    expect(l.requests).toBeGreaterThanOrEqual(l.inFlight);
  }
  return all.find((l) => l.replica === name && l.draining === draining);
}

/** Polls until `f` holds; a bounded wait (generous deadline), never a timing assertion. */
async function until(f: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** A port nothing listens on. */
async function closedPort(): Promise<Upstream> {
  const port = await freePort();
  return { isReady: () => true, open: () => tcp(port) };
}

function streamed(text: string): Readable {
  return Readable.from([Buffer.from(text.slice(0, 3)), Buffer.from(text.slice(3))], { objectMode: false });
}

describe('the choice: least outstanding requests', () => {
  it('sends new requests to the replica holding fewer in flight', async () => {
    const a = await replica('a', 'hold');
    const b = await replica('b');
    const rs = books_();
    add(rs, a, b);
    b.ready = false; // only A in rotation while it fills up
    const slow = Array.from({ length: 5 }, () => send(rs));
    await until(() => a.held.length === 5, 'A to hold 5 requests');
    expect(load(rs, 'a')).toMatchObject({ inFlight: 5, requests: 5, ready: true, draining: false });
    expect(rs.inFlight(a.upstream)).toBe(5);
    b.ready = true;
    for (let i = 0; i < 20; i++) expect((await send(rs).done).body).toBe('b');
    expect(a.hits).toBe(5);
    expect(load(rs, 'b')).toMatchObject({ inFlight: 0, requests: 20 });
    a.release();
    for (const s of slow) expect(await s.done).toMatchObject({ status: 200, body: 'a:held' });
    expect(load(rs, 'a')).toMatchObject({ inFlight: 0, requests: 5 });
  });

  it('with concurrent slow requests, spreads them one by one', async () => {
    const a = await replica('a', 'hold');
    const b = await replica('b', 'hold');
    const rs = books_();
    add(rs, a, b);
    const all = Array.from({ length: 10 }, () => send(rs));
    await until(() => a.held.length + b.held.length === 10, 'both to hold');
    // Each choice saw the counts of the ones before it: 5 and 5, whatever the ties said.
    expect([a.held.length, b.held.length]).toEqual([5, 5]);
    a.release();
    b.release();
    for (const s of all) expect((await s.done).status).toBe(200);
    expect(rs.loads().map((l) => l.inFlight)).toEqual([0, 0]);
  });

  it.each([2, 4])('1,000 sequential requests over %i replicas spread evenly', async (n) => {
    const list = await Promise.all(Array.from({ length: n }, (_, i) => replica(`r${i}`)));
    const rs = books_();
    add(rs, ...list);
    for (let i = 0; i < 1_000; i++) {
      const a = await send(rs).done;
      expect(a.status).toBe(200);
    }
    // One at a time, every replica is equal at each choice: they take turns, exactly.
    expect(list.map((t) => t.hits)).toEqual(list.map(() => 1_000 / n));
    expect(rs.loads().reduce((s, l) => s + l.requests, 0)).toBe(1_000);
    expect(rs.loads().every((l) => l.inFlight === 0)).toBe(true);
  });

  it('among equals, the one chosen longest ago: sequential requests take turns, a new replica goes first', async () => {
    const a = await replica('a');
    const b = await replica('b');
    const c = await replica('c');
    const rs = books_();
    add(rs, a, b, c);
    const order: string[] = [];
    for (let i = 0; i < 6; i++) order.push((await send(rs).done).body);
    expect(order).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
    const d = await replica('d');
    add(rs, d);
    expect((await send(rs).done).body).toBe('d');
  });

  it('skips replicas that are not Ready; none Ready is DP_ERR_NO_READY_REPLICA (503)', async () => {
    const a = await replica('a');
    const b = await replica('b');
    const rs = books_();
    add(rs, a, b);
    a.ready = false;
    for (let i = 0; i < 5; i++) expect((await send(rs).done).body).toBe('b');
    b.ready = false;
    const { error } = await send(rs).done;
    expect(error).toMatchObject({ code: 'DP_ERR_NO_READY_REPLICA' });
    expect(statusFor(error, SVC)).toEqual({ status: 503, code: 'DP_ERR_NO_READY_REPLICA', detail: `Service ${SVC} has no ready replica` });
    // An unknown service too.
    expect((await send(rs, {}, 'proj/none').done).error).toMatchObject({ code: 'DP_ERR_NO_READY_REPLICA' });
    await expect(rs.open(SVC)).rejects.toMatchObject({ code: 'DP_ERR_NO_READY_REPLICA' });
    expect(a.hits + b.hits).toBe(5);
    expect(rs.loads().every((l) => l.inFlight === 0 && !l.ready)).toBe(true);
  });

  it('a failure with no replica reaches the handler after dispatch() returned', async () => {
    const rs = books_();
    let exchange: Http1Exchange | undefined;
    let seen: Http1Exchange | undefined | 'unset' = 'unset';
    const got = new Promise<Error>((resolve) => {
      exchange = rs.dispatch(
        SVC,
        { method: 'GET', path: '/', headers: [] },
        {
          onResponseStart() {},
          onResponseData: () => true,
          onResponseEnd() {},
          onResponseError(err) {
            seen = exchange;
            resolve(err);
          },
        },
      );
    });
    expect(await got).toMatchObject({ code: 'DP_ERR_NO_READY_REPLICA' });
    expect(seen).toBe(exchange);
  });
});

describe('connect failures', () => {
  it('a refused connect sends any request to another replica, a streamed POST too', async () => {
    const dead = await closedPort();
    const b = await replica('b');
    const rs = books_(); // ties: the first listed, the dead one
    rs.set(SVC, 'dead', dead);
    add(rs, b);
    expect((await send(rs).done).body).toBe('b');
    const post = await send(rs, { method: 'POST', headers: ['host', 'svc', 'content-length', '11'], body: streamed('hello world') }).done;
    expect(post).toMatchObject({ status: 200, body: 'b' });
    const chunked = await send(rs, { method: 'POST', body: streamed('chunked body') }).done;
    expect(chunked).toMatchObject({ status: 200, body: 'b' });
    expect(b.bodies).toEqual(['', 'hello world', 'chunked body']);
    expect(load(rs, 'dead')).toMatchObject({ inFlight: 0, requests: 3 });
    expect(load(rs, 'b')).toMatchObject({ inFlight: 0, requests: 3 });
  });

  it('every replica refused: DP_ERR_UPSTREAM_FAILED (502), for dispatch and open', async () => {
    const rs = books_();
    rs.set(SVC, 'x', await closedPort());
    rs.set(SVC, 'y', await closedPort());
    const { error } = await send(rs, { method: 'POST', body: streamed('abcdef') }).done;
    expect(error).toMatchObject({ code: 'DP_ERR_UPSTREAM_FAILED' });
    expect(statusFor(error, SVC)).toMatchObject({ status: 502, code: 'DP_ERR_UPSTREAM_FAILED', detail: 'Error requesting upstream' });
    await expect(rs.open(SVC)).rejects.toMatchObject({ code: 'DP_ERR_UPSTREAM_FAILED' });
    expect(rs.loads().map((l) => [l.inFlight, l.requests])).toEqual([
      [0, 2],
      [0, 2],
    ]);
  });

  it('a connect that never finishes times out: DP_ERR_UPSTREAM_TIMEOUT (504), or another replica', async () => {
    const rs = books_({ connectTimeoutMs: 100 });
    const hang: Upstream = { isReady: () => true, open: () => new Promise<Duplex>(() => undefined) };
    rs.set(SVC, 'hang', hang);
    const { error } = await send(rs).done;
    expect(error).toMatchObject({ code: 'DP_ERR_UPSTREAM_TIMEOUT' });
    expect(statusFor(error, SVC)).toMatchObject({ status: 504, code: 'DP_ERR_UPSTREAM_TIMEOUT' });
    await expect(rs.open(SVC)).rejects.toMatchObject({ code: 'DP_ERR_UPSTREAM_TIMEOUT' });
    expect(load(rs, 'hang')).toMatchObject({ inFlight: 0, requests: 2 });
    const b = await replica('b');
    add(rs, b);
    expect((await send(rs, { method: 'POST', body: 'x' }).done).body).toBe('b');
  });
});

describe('a replica that closes the connection before answering', () => {
  it('a replica silent past the read timeout: DP_HTTP1_HEADERS_TIMEOUT → 504, not sent again', async () => {
    const slow = await replica('slow', 'hold');
    const good = await replica('good');
    const rs = books_({ readTimeoutMs: 200 });
    add(rs, slow, good);
    const { error } = await send(rs).done;
    expect(statusFor(error, SVC)).toMatchObject({ status: 504, code: 'DP_ERR_UPSTREAM_TIMEOUT' });
    expect(good.hits).toBe(0);
    expect(rs.loads().every((l) => l.inFlight === 0)).toBe(true);
  });

  it('a GET goes once more to another replica and succeeds', async () => {
    const bad = await replica('bad', 'close');
    const good = await replica('good');
    const rs = books_();
    add(rs, bad, good);
    expect(await send(rs).done).toMatchObject({ status: 200, body: 'good' });
    expect(await send(rs, { method: 'PUT', body: Buffer.from('put') }).done).toMatchObject({ status: 200, body: 'good' });
    expect(bad.hits).toBe(2);
    expect(good.bodies).toEqual(['', 'put']);
    expect(rs.loads().every((l) => l.inFlight === 0)).toBe(true);
  });

  it('a POST, or a GET with a streamed body, fails with 502 and is not sent again', async () => {
    const bad = await replica('bad', 'close');
    const good = await replica('good');
    // Fresh books for each: the first of equals (bad) is chosen first.
    for (const req of [{ method: 'POST', body: 'once' }, { body: streamed('streamed') }]) {
      const rs = books_();
      add(rs, bad, good);
      const { error } = await send(rs, req).done;
      expect(statusFor(error, SVC).status).toBe(502);
      expect(rs.loads().every((l) => l.inFlight === 0)).toBe(true);
    }
    expect(good.hits).toBe(0);
    expect(bad.bodies).toEqual(['once', 'streamed']);
  });

  it('only once: two bad replicas → 502, the third never asked', async () => {
    const bad1 = await replica('bad1', 'close');
    const bad2 = await replica('bad2', 'close');
    const good = await replica('good');
    const rs = books_(); // the first of equals: bad1, then bad2
    add(rs, bad1, bad2, good);
    const { error } = await send(rs).done;
    expect(statusFor(error, SVC)).toMatchObject({ status: 502, code: 'DP_ERR_UPSTREAM_FAILED', detail: 'Error requesting upstream' });
    expect([bad1.hits, bad2.hits, good.hits]).toEqual([1, 1, 0]);
  });
});

describe('removal and drain', () => {
  it('a removed replica gets no new request; its request in flight completes; drain resolves then', async () => {
    const a = await replica('a', 'hold');
    const b = await replica('b', 'hold');
    const rs = books_();
    add(rs, a, b);
    b.ready = false;
    const onA = send(rs);
    b.ready = true;
    a.ready = false;
    const onB = [send(rs), send(rs)];
    a.ready = true;
    await until(() => a.held.length === 1 && b.held.length === 2, 'a 1, b 2');
    rs.remove(SVC, 'a');
    expect(load(rs, 'a', true)).toMatchObject({ inFlight: 1, draining: true, ready: false });
    expect(rs.inFlight(a.upstream)).toBe(1);
    // A has fewer in flight, but is out of rotation.
    const next = send(rs);
    await until(() => b.held.length === 3, 'b 3');
    expect(a.hits).toBe(1);
    let drained = false;
    const drain = rs.drain(a.upstream, 60_000).then(() => (drained = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(drained).toBe(false);
    a.release();
    expect(await onA.done).toMatchObject({ status: 200, body: 'a:held' });
    await drain;
    expect(rs.inFlight(a.upstream)).toBe(0);
    expect(load(rs, 'a', true)).toBeUndefined();
    b.release();
    for (const s of [...onB, next]) expect((await s.done).body).toBe('b:held');
    expect(rs.loads()).toEqual([{ service: SVC, replica: 'b', ready: true, draining: false, inFlight: 0, requests: 3, total: 3 }]);
  });

  it('drain cuts what is left after its period', async () => {
    const a = await replica('a', 'hold');
    const rs = books_();
    add(rs, a);
    const held = send(rs);
    await until(() => a.held.length === 1, 'a to hold');
    const pinned = await rs.open(SVC);
    const pinnedClosed = new Promise((r) => pinned.once('close', r));
    expect(load(rs, 'a')).toMatchObject({ inFlight: 2, requests: 2 });
    rs.remove(SVC, 'a');
    await rs.drain(a.upstream, 100);
    const { error } = await held.done;
    expect(statusFor(error, SVC).status).toBe(502);
    await pinnedClosed;
    await until(() => a.closedSockets >= 2, 'the replica to see both connections close');
    expect(rs.inFlight(a.upstream)).toBe(0);
    expect(rs.loads()).toEqual([]);
  });

  it('drain of a replica with nothing in flight resolves at once and forgets it', async () => {
    const a = await replica('a');
    const rs = books_();
    add(rs, a);
    await send(rs).done;
    rs.remove(SVC, 'a');
    expect(rs.loads()).toEqual([]);
    await rs.drain(a.upstream, 60_000);
    expect(rs.inFlight(a.upstream)).toBe(0);
  });

  it('set() with the same id replaces the replica; the old one drains', async () => {
    const a1 = await replica('a1', 'hold');
    const a2 = await replica('a2');
    const rs = books_();
    rs.set(SVC, 'a', a1.upstream);
    const old = send(rs);
    await until(() => a1.held.length === 1, 'a1 to hold');
    rs.set(SVC, 'a', a2.upstream);
    expect(rs.loads()).toEqual([
      { service: SVC, replica: 'a', ready: false, draining: true, inFlight: 1, requests: 1, total: 1 },
      { service: SVC, replica: 'a', ready: true, draining: false, inFlight: 0, requests: 0, total: 1 },
    ]);
    for (let i = 0; i < 3; i++) expect((await send(rs).done).body).toBe('a2');
    expect(a1.hits).toBe(1);
    const drain = rs.drain(a1.upstream, 60_000);
    a1.release();
    expect((await old.done).body).toBe('a1:held');
    await drain;
    // The id's total went on through the replacement: a counter of it never goes back.
    expect(rs.loads()).toEqual([{ service: SVC, replica: 'a', ready: true, draining: false, inFlight: 0, requests: 3, total: 4 }]);
  });

  it("remove() then set() of the same id (a new address) continues the id's total while the old drains", async () => {
    const a1 = await replica('a1', 'hold');
    const a2 = await replica('a2');
    const rs = books_();
    rs.set(SVC, 'a', a1.upstream);
    const first = send(rs);
    await until(() => a1.held.length === 1, 'a1 to hold');
    rs.remove(SVC, 'a');
    rs.set(SVC, 'a', a2.upstream);
    await send(rs).done;
    expect(rs.loads().map((l) => [l.draining, l.requests, l.total])).toEqual([
      [true, 1, 2],
      [false, 1, 2],
    ]);
    const drain = rs.drain(a1.upstream, 60_000);
    a1.release();
    expect((await first.done).body).toBe('a1:held');
    await drain;
    expect(rs.loads().map((l) => [l.draining, l.requests, l.total])).toEqual([[false, 1, 2]]);
    // Gone entirely, the id starts again from 0.
    rs.remove(SVC, 'a');
    rs.set(SVC, 'a', a1.upstream);
    expect(rs.loads().map((l) => l.total)).toEqual([0]);
  });

  it('drain() of an upstream still in rotation resolves at once and leaves it serving; twice waits for one end', async () => {
    const a = await replica('a', 'hold');
    const rs = books_();
    add(rs, a);
    const held = send(rs);
    await until(() => a.held.length === 1, 'a to hold');
    await rs.drain(a.upstream, 10);
    await new Promise((r) => setTimeout(r, 50));
    expect(load(rs, 'a')).toMatchObject({ inFlight: 1, draining: false });
    rs.remove(SVC, 'a');
    const d1 = rs.drain(a.upstream, 60_000);
    const d2 = rs.drain(a.upstream, 60_000);
    expect(d2).toBe(d1);
    a.release();
    expect((await held.done).body).toBe('a:held');
    await d1;
    expect(rs.loads()).toEqual([]);
  });

  it('set() again with the same upstream keeps the replica, its counts and connections', async () => {
    const a = await replica('a');
    const rs = books_();
    add(rs, a);
    await send(rs).done;
    add(rs, a);
    await send(rs).done;
    expect(rs.loads()).toEqual([{ service: SVC, replica: 'a', ready: true, draining: false, inFlight: 0, requests: 2, total: 2 }]);
    expect(a.closedSockets).toBe(0); // the keep-alive connection was reused, not closed
  });
});

describe('abort and pinned streams', () => {
  it("the caller's abort closes the replica's connection and the count goes back to 0", async () => {
    const a = await replica('a', 'hold');
    const rs = books_();
    add(rs, a);
    const s = send(rs);
    await until(() => a.held.length === 1, 'a to hold');
    const reqClosed = new Promise((r) => a.held[0]!.res.once('close', r));
    expect(rs.inFlight(a.upstream)).toBe(1);
    s.ex.abort();
    const { error } = await s.done;
    expect(error).toMatchObject({ code: 'DP_ERR_CLIENT_CLOSED' });
    expect(statusFor(error, SVC).status).toBe(499);
    await reqClosed;
    expect(load(rs, 'a')).toMatchObject({ inFlight: 0, requests: 1 });
    s.ex.abort(); // twice: nothing more
    expect(load(rs, 'a')).toMatchObject({ inFlight: 0, requests: 1 });
  });

  it('an abort during a slow connect ends the request and is not sent anywhere', async () => {
    let opened!: (d: Duplex) => void;
    const slow: Upstream = { isReady: () => true, open: () => new Promise<Duplex>((r) => (opened = r)) };
    const b = await replica('b');
    const rs = books_();
    rs.set(SVC, 'slow', slow);
    const s = send(rs);
    add(rs, b);
    s.ex.abort();
    expect((await s.done).error).toMatchObject({ code: 'DP_ERR_CLIENT_CLOSED' });
    opened(await tcp(b.port));
    await new Promise((r) => setTimeout(r, 50));
    expect(b.hits).toBe(0);
    expect(rs.loads().every((l) => l.inFlight === 0)).toBe(true);
  });

  it('an open() stream counts in flight until it closes, and speaks to one replica', async () => {
    const a = await replica('a');
    const dead = await closedPort();
    const rs = books_();
    rs.set(SVC, 'dead', dead);
    add(rs, a);
    const s = await rs.open(SVC); // the dead one first, then a
    expect(load(rs, 'a')).toMatchObject({ inFlight: 1, requests: 1 });
    expect(load(rs, 'dead')).toMatchObject({ inFlight: 0, requests: 1 });
    // While it is open, a new request goes to the other… which is dead: skipped too.
    let text = '';
    s.on('data', (c: Buffer) => (text += c.toString()));
    s.write('GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n');
    await until(() => text.split('HTTP/1.1 200').length === 3, 'two answers on the pinned stream');
    expect(a.hits).toBe(2);
    expect(load(rs, 'a')).toMatchObject({ inFlight: 1, requests: 1 });
    s.destroy();
    await until(() => load(rs, 'a')!.inFlight === 0, 'the pinned stream to leave the count');
    expect(load(rs, 'a')).toMatchObject({ inFlight: 0, requests: 1 });
  });
});

describe('a pinned stream opening while its replica is cut', () => {
  it('is closed, not handed out, and the count goes back to 0', async () => {
    const a = await replica('a');
    let opened!: (d: Duplex) => void;
    const slow: Upstream = { isReady: () => true, open: () => new Promise<Duplex>((r) => (opened = r)) };
    const rs = books_();
    rs.set(SVC, 'slow', slow);
    const pending = rs.open(SVC);
    expect(rs.inFlight(slow)).toBe(1);
    rs.remove(SVC, 'slow');
    await rs.drain(slow, 10); // cut: the open is still pending
    const sock = await tcp(a.port);
    const closed = new Promise((r) => sock.once('close', r));
    opened(sock);
    await expect(pending).rejects.toMatchObject({ code: 'DP_ERR_UPSTREAM_FAILED' });
    await closed;
    expect(rs.inFlight(slow)).toBe(0);
    expect(rs.loads()).toEqual([]);
  });
});

describe('requests queued behind the connection limit', () => {
  it('count in flight while queued; an abort of a queued one takes it off the count and off the replica', async () => {
    const a = await replica('a', 'hold');
    const rs = books_({ connectionsPerReplica: 1 });
    add(rs, a);
    const first = send(rs);
    await until(() => a.held.length === 1, 'a to hold the first');
    const queued = send(rs, { path: '/queued' });
    const third = send(rs, { path: '/third' });
    expect(load(rs, 'a')).toMatchObject({ inFlight: 3, requests: 3 });
    queued.ex.abort();
    expect((await queued.done).error).toMatchObject({ code: 'DP_ERR_CLIENT_CLOSED' });
    expect(load(rs, 'a')).toMatchObject({ inFlight: 2, requests: 3 });
    a.release();
    expect((await first.done).body).toBe('a:held');
    await until(() => a.held.length === 1, 'a to hold the third');
    expect(a.held[0]!.req.url).toBe('/third'); // the aborted one never went out
    a.release();
    expect((await third.done).body).toBe('a:held');
    expect(load(rs, 'a')).toMatchObject({ inFlight: 0, requests: 3 });
    expect(a.hits).toBe(2);
  });
});
