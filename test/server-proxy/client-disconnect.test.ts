// Clients that hang up at the worst moment, against the built `server-proxy` process: a chunked
// upload cut mid-body before and after the connection to the replica opened, after the replica
// already answered, a body passing clientMaxBodySize after the answer; then 1,000 requests cut at
// random points (mid-head, mid-body, mid-response; chunked and fixed length; on the raw fast path
// and on Node's handover path). Each fails alone: the process stays up and answers normally.
// The random run prints its seed; DP_FUZZ_SEED=<seed> replays it.

import { createServer, type IncomingMessage, type Server } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { tmpDir } from '../helpers/tmp.js';
import { startServerProxyProcess, type ProxyProcess } from './cli-process.js';
import { directService, doc, send } from './harness.js';
import { prng } from '../helpers/prng.js';

const TOKEN = 'disconnect-test-management-token-0123456789';
const SMALL_LIMIT = 1024;

/** A replica that tells the test what it saw: heads, bodies that ended, bodies cut short. */
interface Replica {
  server: Server;
  port: number;
  heads: number;
  cut: number;
  close(): Promise<void>;
}

async function startReplica(): Promise<Replica> {
  const r: Replica = { server: undefined as unknown as Server, port: 0, heads: 0, cut: 0, close: async () => undefined };
  const server = createServer({ keepAliveTimeout: 5_000 }, (req: IncomingMessage, res) => {
    r.heads++;
    let ended = false;
    req.on('end', () => (ended = true));
    req.on('close', () => {
      if (!ended) r.cut++;
    });
    req.on('error', () => undefined);
    res.on('error', () => undefined);
    const path = (req.url ?? '/').split('?')[0]!;
    if (path.endsWith('/early')) {
      // Answers at once, before reading the body (the body is still coming up the proxy).
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 5 });
      res.end('early');
      req.resume();
      return;
    }
    let bytes = 0;
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      if (path.endsWith('/drip')) {
        // A response in pieces on later ticks: a client can leave in the middle of it.
        res.writeHead(200, { 'content-type': 'text/plain' });
        let n = 0;
        const next = (): void => {
          if (res.destroyed) return;
          if (n++ === 8) return void res.end('end');
          res.write('x'.repeat(1024));
          setTimeout(next, 2);
        };
        next();
        return;
      }
      const text = JSON.stringify({ bytes });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  r.server = server;
  r.port = (server.address() as { port: number }).port;
  r.close = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return r;
}

let replica: Replica;
let proxy: ProxyProcess;
let port: number;
let cleanup: () => void;

beforeAll(async () => {
  replica = await startReplica();
  const tmp = tmpDir('dp-sp-cut-');
  cleanup = tmp.cleanup;
  writeFileSync(`${tmp.dir}/token`, `${TOKEN}\n`, { mode: 0o600 });
  proxy = await startServerProxyProcess([
    '--db',
    `sqlite:${tmp.dir}/proxy.db`,
    '--port',
    '0',
    '--state-dir',
    `${tmp.dir}/state`,
    '--api-token-file',
    `${tmp.dir}/token`,
  ]);
  port = Number(new URL(proxy.url).port);
  const put = await send(`${proxy.url}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify(
      doc([directService('t', 'pub', replica.port), directService('t', 'small', replica.port, { clientMaxBodySize: SMALL_LIMIT })], ['t']),
    ),
  });
  expect(put.status, put.body.toString()).toBe(200);
  await eventually(async () => ((await send(`${proxy.url}/proxy/services/t/pub/echo`)).status === 200 ? true : undefined), 15_000);
}, 60_000);

afterAll(async () => {
  await proxy?.stop();
  await replica?.close();
  cleanup?.();
});

/** A client connection that keeps what it receives and says when it closed. */
class Client {
  readonly socket: Socket;
  received = '';
  closed: Promise<void>;
  constructor() {
    this.socket = netConnect(port, '127.0.0.1');
    this.socket.on('error', () => undefined);
    this.socket.on('data', (c: Buffer) => (this.received += c.toString('latin1')));
    this.closed = new Promise((resolve) => this.socket.once('close', () => resolve()));
  }
  write(s: string | Buffer): void {
    this.socket.write(s);
  }
  /** Wait until `re` matches what arrived. */
  until(re: RegExp): Promise<void> {
    return eventually(() => (re.test(this.received) ? true : undefined), 10_000).then(() => undefined);
  }
}

/** The process is up and serves both paths as before: a small POST (raw path), a chunked upload (Node's). */
async function answersNormally(): Promise<void> {
  expect(proxy.alive(), proxy.output()).toBe(true);
  const small = await send(`${proxy.url}/proxy/services/t/pub/echo`, { method: 'POST', body: 'hello', headers: { 'content-length': '5' } });
  expect(small.status).toBe(200);
  expect(small.json()).toEqual({ bytes: 5 });
  const chunked = await send(`${proxy.url}/proxy/services/t/pub/echo`, {
    method: 'POST',
    body: 'x'.repeat(3000),
    headers: { 'transfer-encoding': 'chunked' },
  });
  expect(chunked.json()).toEqual({ bytes: 3000 });
  expect(proxy.alive(), proxy.output()).toBe(true);
}

const CHUNKED_HEAD = (path: string): string => `POST /proxy/services/t/${path} HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n`;

describe('a client that hangs up fails its own request only', () => {
  it('mid-chunked-body, at once (before or while the connection to the replica opens)', async () => {
    for (let i = 0; i < 20; i++) {
      const c = new Client();
      c.write(`${CHUNKED_HEAD('pub/echo')}5\r\nab`);
      c.socket.destroy();
      await c.closed;
    }
    await answersNormally();
  });

  it('mid-chunked-body, after the replica got the request head', async () => {
    const heads = replica.heads;
    const cut = replica.cut;
    const c = new Client();
    c.write(`${CHUNKED_HEAD('pub/echo')}5\r\nabcde\r\n3\r\nab`);
    await eventually(() => (replica.heads > heads ? true : undefined), 10_000);
    c.socket.destroy();
    // The proxy noticed: it closed the connection to the replica mid-body.
    await eventually(() => (replica.cut > cut ? true : undefined), 10_000);
    await answersNormally();
  });

  it('mid-chunked-body, after the replica already answered', async () => {
    const c = new Client();
    c.write(`${CHUNKED_HEAD('pub/early')}5\r\nabcde\r\n`);
    await c.until(/\r\n\r\nearly$/);
    c.write('10\r\nmore of the body');
    c.socket.destroy();
    await c.closed;
    await answersNormally();
  });

  it('a chunked body passing clientMaxBodySize after the replica already answered', async () => {
    const c = new Client();
    c.write(`${CHUNKED_HEAD('small/early')}5\r\nabcde\r\n`);
    await c.until(/\r\n\r\nearly$/);
    const big = 'y'.repeat(SMALL_LIMIT * 2);
    c.write(`${big.length.toString(16)}\r\n${big}\r\n`);
    // The proxy stops reading or closes; either way the client goes, and nothing else fails.
    setTimeout(() => c.socket.destroy(), 50).unref();
    await c.closed;
    await answersNormally();
  });

  it('WebSocket upgrades, refused (404) or proxied, reset by the client at once', async () => {
    for (let i = 0; i < 20; i++) {
      const c = new Client();
      const path = i % 2 ? '/nope/ws' : '/proxy/services/t/pub/ws';
      c.write(
        `GET ${path} HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
      await new Promise((r) => setImmediate(r));
      c.socket.resetAndDestroy();
      await c.closed;
    }
    await answersNormally();
  });

  it('a chunked body passing clientMaxBodySize before any answer is a 413', async () => {
    const c = new Client();
    const big = 'y'.repeat(SMALL_LIMIT * 2);
    c.write(`${CHUNKED_HEAD('small/echo')}${big.length.toString(16)}\r\n${big}\r\n0\r\n\r\n`);
    await c.until(/^HTTP\/1\.1 413 /).catch((err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify(c.received)}`);
    });
    c.socket.destroy();
    await answersNormally();
  });
});

type Cut = 'head' | 'body' | 'response' | 'none';

/** One request, built and cut as `rand` decides; resolves when the client side is closed. */
async function randomRequest(rand: () => number): Promise<{ cut: Cut; answered: boolean; what: string }> {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const cut = pick(['head', 'body', 'response', 'none'] as const);
  const chunked = rand() < 0.5;
  // Node's path: any chunked body, or HTTP/1.0 keep-alive, or a body sent after its head.
  const node = chunked || rand() < 0.5;
  const http10 = node && !chunked && rand() < 0.5;
  const path = pick(['pub/echo', 'pub/drip', 'pub/early', 'small/echo', 'small/early']);
  const size = pick([0, 10, 900, 3000, 70_000]);
  const body = Buffer.alloc(size, 0x61);
  let head = `POST /proxy/services/t/${path} HTTP/1.${http10 ? 0 : 1}\r\nHost: h\r\n${http10 ? 'Connection: keep-alive\r\n' : ''}`;
  head += chunked ? 'Transfer-Encoding: chunked\r\n\r\n' : `Content-Length: ${size}\r\n\r\n`;
  const framed = chunked
    ? Buffer.concat([Buffer.from(size > 0 ? `${size.toString(16)}\r\n` : ''), body, Buffer.from(size > 0 ? '\r\n0\r\n\r\n' : '0\r\n\r\n')])
    : body;

  const c = new Client();
  const hangUp = (): void => {
    if (rand() < 0.5) c.socket.resetAndDestroy();
    else c.socket.destroy();
  };
  await Promise.race([new Promise<void>((resolve) => c.socket.once('connect', () => resolve())), c.closed]);
  if (c.socket.destroyed) throw new Error('the proxy refused the connection');
  if (cut === 'head') {
    c.write(head.slice(0, 1 + Math.floor(rand() * (head.length - 1))));
    if (rand() < 0.5) await new Promise((r) => setImmediate(r));
    hangUp();
  } else {
    if (node && !chunked && !http10) {
      // The head alone first: the raw path hands the connection to Node's server mid-request.
      c.write(head);
      await new Promise((r) => setImmediate(r));
    } else c.write(head);
    if (cut === 'body') {
      c.write(framed.subarray(0, Math.floor(rand() * framed.length)));
      if (rand() < 0.5) await new Promise((r) => setTimeout(r, Math.floor(rand() * 5)));
      hangUp();
    } else {
      c.write(framed);
      if (cut === 'response') {
        await Promise.race([eventually(() => (c.received.length > 0 ? true : undefined), 10_000), c.closed]).catch(() => undefined);
        hangUp();
      } else {
        await Promise.race([eventually(() => (/^HTTP\/1\.[01] \d{3} /.test(c.received) ? true : undefined), 10_000), c.closed]).catch(
          () => undefined,
        );
        c.socket.destroy();
      }
    }
  }
  await c.closed;
  const what = `${cut} ${chunked ? 'chunked' : 'fixed'} ${node ? 'node' : 'raw'}${http10 ? ' 1.0' : ''} ${path} ${size}: ${JSON.stringify(c.received.slice(0, 200))}`;
  return { cut, answered: /^HTTP\/1\.[01] \d{3} /.test(c.received), what };
}

it('1,000 requests cut at random points: the process stays up and answers normally', async () => {
  const seed = Number(process.env.DP_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`client-disconnect fuzz seed: ${seed} (DP_FUZZ_SEED=${seed} replays it)`);
  const rand = prng(seed);
  let next = 0;
  let uncut = 0;
  let uncutAnswered = 0;
  const unanswered: string[] = [];
  const worker = async (): Promise<void> => {
    while (next < 1000) {
      next++;
      const r = await randomRequest(rand);
      if (r.cut === 'none') {
        uncut++;
        if (r.answered) uncutAnswered++;
        else unanswered.push(r.what);
      }
      if (!proxy.alive()) throw new Error(`server-proxy died (seed ${seed}):\n${proxy.output()}`);
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
  // Requests nobody cut got an answer (a status line; 413 for the small service counts).
  expect(unanswered, `seed ${seed}`).toEqual([]);
  expect(uncutAnswered).toBe(uncut);
  await answersNormally();
}, 300_000);
