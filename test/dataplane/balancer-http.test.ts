// The balancer socket relaying request by request: real HTTP replicas on 127.0.0.1, a real HTTP
// client (and raw sockets for what no client would send) on the service's Unix socket, and real
// Nginx in front for the keep-alive spread.

import { createHash, randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { Agent, createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type Server as NetServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, Replicas, type Upstream } from '../../src/dataplane/index.js';
import { eventually, startTestNginx, type TestNginx } from '../helpers/nginx.js';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { tmpDir } from '../helpers/tmp.js';

const MiB = 1024 * 1024;
const BIG = randomBytes(16 * MiB);
const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

function tcpUpstream(port: number): Upstream {
  return {
    isReady: () => true,
    open: () =>
      new Promise((resolve, reject) => {
        const s = connect({ host: '127.0.0.1', port });
        s.once('connect', () => resolve(s));
        s.once('error', reject);
      }),
  };
}

/** Gates an SSE-style answer: the replica sends its next piece only once the test let it. */
const gates: (() => void)[] = [];
const waitGate = (): Promise<void> => new Promise((r) => gates.push(r));
/** Answers held by the replica until the test ends them. */
const holds: (() => void)[] = [];
/** The replica saw its connection close under an unfinished answer. */
let sawAbort: (() => void) | null = null;

interface Replica {
  name: string;
  server: Server;
  port: number;
  hits: number;
}

async function startReplica(name: string): Promise<Replica> {
  const r: Replica = { name, server: null as unknown as Server, port: 0, hits: 0 };
  r.server = createServer((req: IncomingMessage, res: ServerResponse) => {
    r.hits++;
    const url = req.url ?? '/';
    if (url === '/sha') {
      const h = createHash('sha256');
      let n = 0;
      req.on('data', (d: Buffer) => {
        h.update(d);
        n += d.length;
      });
      req.on('end', () => res.end(JSON.stringify({ name, n, sha: h.digest('hex'), te: req.headers['transfer-encoding'] ?? null })));
      return;
    }
    if (url === '/big') return void res.end(BIG);
    if (url === '/head') {
      res.writeHead(200, { 'content-length': '1234', 'x-name': name });
      return void res.end();
    }
    if (url === '/204') return void res.writeHead(204, { 'x-name': name }).end();
    if (url === '/304') return void res.writeHead(304, { etag: '"x"' }).end();
    if (url === '/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      void (async () => {
        for (let i = 0; i < 3; i++) {
          res.write(`data: ${i}\n\n`);
          await waitGate();
        }
        res.end();
      })();
      return;
    }
    if (url === '/hold') return void holds.push(() => res.end('held'));
    if (url === '/hang') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first');
      res.once('close', () => sawAbort?.());
      return;
    }
    req.resume();
    req.on('end', () => res.end(JSON.stringify({ name, method: req.method, url, headers: req.headers })));
  });
  r.server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    r.hits++;
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${req.headers.upgrade ?? ''}\r\nConnection: Upgrade\r\n\r\n`);
    if (head.length > 0) socket.write(Buffer.concat([Buffer.from(`${name}:`), head]));
    socket.on('data', (d: Buffer) => socket.write(Buffer.concat([Buffer.from(`${name}:`), d])));
    socket.on('end', () => socket.end());
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((resolve) => r.server.listen(0, '127.0.0.1', resolve));
  r.port = (r.server.address() as { port: number }).port;
  return r;
}

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

function send(
  socketPath: string,
  o: { path: string; method?: string; headers?: Record<string, string>; body?: Buffer | Buffer[]; agent?: Agent },
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({
      socketPath,
      path: o.path,
      method: o.method ?? 'GET',
      headers: { host: 'svc', ...o.headers },
      agent: o.agent,
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (Array.isArray(o.body)) {
      // Written piece by piece without a length: Node sends it chunked.
      void (async () => {
        for (const b of o.body as Buffer[]) {
          req.write(b);
          await new Promise((r) => setImmediate(r));
        }
        req.end();
      })();
    } else req.end(o.body);
  });
}

/** Raw bytes on a new connection to the socket; what came back by the time the balancer closed it. */
function raw(socketPath: string, bytes: string | Buffer, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ path: socketPath });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no close within ${timeoutMs} ms; got ${Buffer.concat(chunks).toString('latin1')}`));
    }, timeoutMs);
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', () => undefined);
    s.once('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString('latin1'));
    });
    s.write(bytes);
  });
}

let tmp: ReturnType<typeof tmpDir>;
let a: Replica;
let b: Replica;
let replicas: Replicas;
let balancer: Balancer;
let path: string;

beforeAll(async () => {
  tmp = tmpDir('dp-bal-http-');
  [a, b] = await Promise.all([startReplica('a'), startReplica('b')]);
  replicas = new Replicas();
  replicas.set('p/svc', 'a', tcpUpstream(a.port));
  replicas.set('p/svc', 'b', tcpUpstream(b.port));
  replicas.set('p/one', 'a', tcpUpstream(a.port));
  balancer = new Balancer({ socketDir: tmp.dir, replicas });
  expect(await balancer.listenAll(['p/svc', 'p/one', 'p/none'])).toEqual(new Map());
  path = balancer.socketPathFor('p/svc');
});

afterAll(async () => {
  await balancer?.close();
  await replicas?.close();
  for (const r of [a, b]) {
    r?.server.closeAllConnections();
    await new Promise((done) => r?.server.close(done));
  }
  tmp?.cleanup();
});

describe('per-request balancing', () => {
  it('spreads 100 sequential requests on one keep-alive connection over both replicas', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const accepted = balancer.stats.accepted;
    const before = [a.hits, b.hits];
    for (let i = 0; i < 100; i++) {
      const r = await send(path, { path: `/who/${i}`, agent });
      expect(r.status).toBe(200);
    }
    agent.destroy();
    expect(balancer.stats.accepted - accepted).toBe(1);
    const got = [a.hits - before[0]!, b.hits - before[1]!];
    expect(got[0]! + got[1]!).toBe(100);
    expect(got[0]).toBeGreaterThanOrEqual(40);
    expect(got[0]).toBeLessThanOrEqual(60);
  });

  it('drops hop-by-hop request headers and keeps the rest in order', async () => {
    const r = await send(balancer.socketPathFor('p/one'), {
      path: '/h',
      headers: { connection: 'keep-alive, x-hop', 'x-hop': '1', 'keep-alive': 'timeout=5', te: 'trailers', 'x-end': 'yes' },
    });
    const headers = (JSON.parse(r.body.toString()) as { headers: Record<string, string> }).headers;
    expect(headers['x-hop']).toBeUndefined();
    expect(headers.te).toBeUndefined();
    expect(headers['keep-alive']).toBeUndefined();
    expect(headers['x-end']).toBe('yes');
    expect(headers.host).toBe('svc');
  });
});

describe('bodies', () => {
  it('carries a chunked upload, decoded and re-framed', async () => {
    const pieces = Array.from({ length: 50 }, (_, i) => randomBytes(1000 + i * 37));
    const r = await send(path, { path: '/sha', method: 'POST', body: pieces });
    const j = JSON.parse(r.body.toString()) as { n: number; sha: string; te: string | null };
    const all = Buffer.concat(pieces);
    expect(j.n).toBe(all.length);
    expect(j.sha).toBe(sha(all));
  });

  it('carries 16 MiB up (Content-Length, streamed) and down intact', async () => {
    const up = await send(path, { path: '/sha', method: 'POST', body: BIG });
    expect(up.status).toBe(200);
    expect(JSON.parse(up.body.toString())).toMatchObject({ n: BIG.length, sha: sha(BIG) });
    const down = await send(path, { path: '/big' });
    expect(down.status).toBe(200);
    expect(down.headers['content-length']).toBe(String(BIG.length));
    expect(down.body.length).toBe(BIG.length);
    expect(sha(down.body)).toBe(sha(BIG));
  });

  it('answers HEAD, 204 and 304 without a body, keeping the connection', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const accepted = balancer.stats.accepted;
    const head = await send(path, { path: '/head', method: 'HEAD', agent });
    expect(head.status).toBe(200);
    expect(head.headers['content-length']).toBe('1234');
    expect(head.body.length).toBe(0);
    const nc = await send(path, { path: '/204', agent });
    expect(nc.status).toBe(204);
    expect(nc.headers['x-name']).toMatch(/^[ab]$/);
    const nm = await send(path, { path: '/304', agent });
    expect(nm.status).toBe(304);
    expect(nm.headers.etag).toBe('"x"');
    const after = await send(path, { path: '/who', agent });
    expect(after.status).toBe(200);
    agent.destroy();
    expect(balancer.stats.accepted - accepted).toBe(1);
  });

  it('relays a chunked answer piece by piece, each before the replica sends the next', async () => {
    const got: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest({ socketPath: path, path: '/sse', headers: { host: 'svc' } });
      req.on('response', (res) => {
        expect(res.headers['transfer-encoding']).toBe('chunked');
        res.on('data', (d: Buffer) => {
          got.push(d.toString());
          // The replica waits on this gate: this piece arrived while the next was not yet sent.
          gates.shift()?.();
        });
        res.on('end', resolve);
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
    expect(got).toEqual(['data: 0\n\n', 'data: 1\n\n', 'data: 2\n\n']);
  });
});

describe('HTTP/1.0', () => {
  it('answers an HTTP/1.0 request and closes; with keep-alive it stays open for the next', async () => {
    const text = await raw(path, 'GET /who HTTP/1.0\r\n\r\n');
    expect(text).toMatch(/^HTTP\/1\.1 200 [^]*\r\nConnection: close\r\n\r\n\{"name":"[ab]"/);
    const s = connect({ path });
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.write('GET /sse HTTP/1.0\r\nConnection: keep-alive\r\n\r\n');
    // No chunked coding for HTTP/1.0: the streamed answer ends with the connection.
    const closed = new Promise((r) => s.once('close', r));
    await eventually(() => (got.includes('data: 0') ? true : undefined));
    gates.shift()!();
    await eventually(() => (got.includes('data: 1') ? true : undefined));
    gates.shift()!();
    await eventually(() => (got.includes('data: 2') ? true : undefined));
    gates.shift()!();
    await closed;
    expect(got).not.toMatch(/transfer-encoding/i);
    expect(got).toMatch(/\r\nConnection: close\r\n/);
    expect(got.endsWith('data: 0\n\ndata: 1\n\ndata: 2\n\n')).toBe(true);
    const k = connect({ path });
    let two = '';
    k.on('data', (d: Buffer) => (two += d.toString('latin1')));
    k.write('GET /who HTTP/1.0\r\nConnection: keep-alive\r\n\r\n');
    await eventually(() => (two.includes('}') ? true : undefined));
    expect(two).toMatch(/\r\nConnection: keep-alive\r\n/);
    k.write('GET /who HTTP/1.0\r\n\r\n');
    await new Promise((r) => k.once('close', r));
    expect(two.match(/HTTP\/1\.1 200 /g)).toHaveLength(2);
  });
});

describe('pinned connections', () => {
  it('pins an Upgrade to one replica, bytes both ways', async () => {
    const s = connect({ path });
    let text = '';
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    s.write('GET /ws HTTP/1.1\r\nHost: svc\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello');
    await eventually(() => (/\r\n\r\n[ab]:hello/.test(text) ? true : undefined));
    expect(text.startsWith('HTTP/1.1 101 ')).toBe(true);
    const name = /\r\n\r\n([ab]):hello/.exec(text)![1]!;
    for (let i = 0; i < 5; i++) {
      s.write(`m${i}`);
      await eventually(() => (text.endsWith(`${name}:m${i}`) ? true : undefined));
    }
    s.destroy();
    // The pinned stream counts as in flight until it closes; then the choice is even again.
    await eventually(() => (replicas.loads().every((l) => l.inFlight === 0) ? true : undefined));
  });
});

describe('failures', () => {
  let bad: NetServer;
  let badPort = 0;
  const badSockets: Socket[] = [];
  /** The replica connection each target last arrived on. */
  const arrivedOn = new Map<string, Socket>();
  let flaky: NetServer;
  let flakyReplicas: Replicas;
  let flakyBalancer: Balancer;

  beforeAll(async () => {
    const s = await startScriptedReplica((socket, _nth, head) => {
      const target = head.split(' ')[1]!;
      arrivedOn.set(target, socket);
      if (target === '/te-cl')
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n');
      else if (target === '/two-cl') socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!');
      else socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    });
    bad = s.server;
    badPort = s.port;
    bad.on('connection', (c: Socket) => badSockets.push(c));
    replicas.set('p/bad', 'x', tcpUpstream(badPort));
    expect(await balancer.listenAll(['p/bad'])).toEqual(new Map());

    // A replica that closes every connection at its first request, before answering.
    const f = await startScriptedReplica((socket) => socket.destroy());
    flaky = f.server;
    // Among equals the one chosen longest ago: the flaky one (listed first) is tried first, and
    // again after the retry went to the good one.
    flakyReplicas = new Replicas();
    flakyReplicas.set('p/flaky', 'flaky', tcpUpstream(f.port));
    flakyReplicas.set('p/flaky', 'good', tcpUpstream(a.port));
    flakyBalancer = new Balancer({ socketDir: join(tmp.dir, 'flaky'), replicas: flakyReplicas });
    expect(await flakyBalancer.listenAll(['p/flaky'])).toEqual(new Map());
  });

  afterAll(async () => {
    await flakyBalancer?.close();
    await flakyReplicas?.close();
    for (const c of badSockets) c.destroy();
    await new Promise((r) => bad?.close(r));
    await new Promise((r) => flaky?.close(r));
  });

  it.each(['/te-cl', '/two-cl'])('%s: bad framing from the replica is a 502, and its connection is not reused', async (target) => {
    const sock = balancer.socketPathFor('p/bad');
    const r = await send(sock, { path: target });
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body.toString())).toHaveProperty('detail');
    const used = arrivedOn.get(target)!;
    await eventually(() => (used.destroyed || used.readableEnded ? true : undefined));
    const ok = await send(sock, { path: '/ok' });
    expect(ok.status).toBe(200);
    expect(ok.body.toString()).toBe('ok');
    expect(arrivedOn.get('/ok')).not.toBe(used);
  });

  it('a replica closing before answering: a GET is retried on the other one, a POST gets 502', async () => {
    const sock = flakyBalancer.socketPathFor('p/flaky');
    const get = await send(sock, { path: '/g' });
    expect(get.status).toBe(200);
    expect(JSON.parse(get.body.toString())).toMatchObject({ name: 'a', url: '/g' });
    const post = await send(sock, { path: '/p', method: 'POST', body: Buffer.from('{}') });
    expect(post.status).toBe(502);
    expect(JSON.parse(post.body.toString())).toHaveProperty('detail');
  });

  it('answers 503 with the catalog text when no replica is Ready, keeping the connection', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const sock = balancer.socketPathFor('p/none');
    const accepted = balancer.stats.accepted;
    const unavailable = balancer.stats.unavailable;
    for (let i = 0; i < 3; i++) {
      const r = await send(sock, { path: '/x', method: 'POST', body: Buffer.from('abc'), agent });
      expect(r.status).toBe(503);
      expect(JSON.parse(r.body.toString())).toEqual({ detail: 'Service p/none has no ready replica' });
    }
    agent.destroy();
    expect(balancer.stats.accepted - accepted).toBe(1);
    expect(balancer.stats.unavailable - unavailable).toBe(3);
  });

  it.each([
    ['two Hosts', 'GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n', 400],
    ['garbage', 'HELLO THERE\r\n\r\n', 400],
    ['bare LF', 'GET / HTTP/1.1\nHost: a\n\n', 400],
    ['HTTP/2.0', 'GET / HTTP/2.0\r\nHost: a\r\n\r\n', 505],
    ['CONNECT', 'CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n', 501],
    ['TE and CL', 'POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n', 400],
    ['bad chunk size', 'POST /sha HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n', 400],
    ['huge head', `GET / HTTP/1.1\r\nHost: a\r\nX: ${'x'.repeat(70 * 1024)}\r\n\r\n`, 431],
  ])('%s: answered with its status and the connection closed', async (_name, bytes, status) => {
    const text = await raw(path, bytes);
    expect(text.startsWith(`HTTP/1.1 ${status} `)).toBe(true);
    expect(text).toMatch(/\r\nConnection: close\r\n/);
    expect(text).toMatch(/\r\n\r\n\{"detail":".+"\}$/);
    // Still serving.
    expect((await send(path, { path: '/after' })).status).toBe(200);
  });

  it('a chunked body that goes bad mid-stream is a 400 and the connection closes', async () => {
    const s = connect({ path });
    let text = '';
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    const closed = new Promise((r) => s.once('close', r));
    s.write('POST /sha HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n');
    await new Promise((r) => setTimeout(r, 50));
    s.write('5\r\nhelloXX');
    await closed;
    expect(text.startsWith('HTTP/1.1 400 ')).toBe(true);
    expect(text).toMatch(/invalid chunked body/);
  });

  it('a chunked body going bad while its request waits for a replica connection is a 400, no crash', async () => {
    const one = new Replicas({ connectionsPerReplica: 1 });
    one.set('p/q', 'a', tcpUpstream(a.port));
    const bal = new Balancer({ socketDir: join(tmp.dir, 'queue'), replicas: one });
    expect(await bal.listenAll(['p/q'])).toEqual(new Map());
    const sock = bal.socketPathFor('p/q');
    try {
      const held = send(sock, { path: '/hold' });
      await eventually(() => (holds.length > 0 ? true : undefined));
      // The one connection is busy: this request queues, its body arriving meanwhile.
      const s = connect({ path: sock });
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      const closed = new Promise((r) => s.once('close', r));
      s.write('POST /sha HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n');
      await eventually(() => (one.loads()[0]!.inFlight === 2 ? true : undefined));
      s.write('5\r\nhelloXX');
      await closed;
      expect(text.startsWith('HTTP/1.1 400 ')).toBe(true);
      holds.shift()!();
      expect((await held).body.toString()).toBe('held');
      expect((await send(sock, { path: '/who' })).status).toBe(200);
    } finally {
      await bal.close();
      await one.close();
    }
  });

  it('a client hanging up mid-answer closes the replica connection', async () => {
    const aborted = new Promise<void>((r) => (sawAbort = r));
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest({ socketPath: balancer.socketPathFor('p/one'), path: '/hang', headers: { host: 'svc' } });
      req.on('response', (res) => {
        res.once('data', () => {
          req.destroy();
          resolve();
        });
      });
      req.on('error', () => undefined);
      setTimeout(() => reject(new Error('no first piece')), 10_000).unref();
      req.end();
    });
    await aborted;
    sawAbort = null;
  });
});

describe('behind real Nginx', () => {
  let ng: TestNginx;
  beforeAll(async () => {
    ng = await startTestNginx();
    const conf = [
      'upstream bal_svc {',
      `  server unix:${path};`,
      '  keepalive 4;',
      '}',
      'server {',
      `  listen 127.0.0.1:${ng.httpPort};`,
      '  location / {',
      '    proxy_pass http://bal_svc;',
      '    proxy_http_version 1.1;',
      '    proxy_set_header Connection "";',
      '    proxy_buffering off;',
      '    client_max_body_size 0;',
      '  }',
      '}',
      '',
    ].join('\n');
    await writeFile(join(ng.paths.confDir, 'bal-http.conf'), conf);
    await ng.reload();
  }, 30_000);
  afterAll(async () => {
    await ng?.stop();
  });

  it('spreads 100 sequential requests from one client over both replicas on reused upstream connections', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    await eventually(async () => ((await nginxGet(ng.httpPort, '/who', agent)).status === 200 ? true : undefined));
    const accepted = balancer.stats.accepted;
    const before = [a.hits, b.hits];
    for (let i = 0; i < 100; i++) expect((await nginxGet(ng.httpPort, `/who/${i}`, agent)).status).toBe(200);
    agent.destroy();
    const got = [a.hits - before[0]!, b.hits - before[1]!];
    expect(got[0]! + got[1]!, JSON.stringify(replicas.loads())).toBe(100);
    expect(got[0]).toBeGreaterThanOrEqual(40);
    expect(got[0]).toBeLessThanOrEqual(60);
    // Nginx reused its upstream connection: far fewer accepted than requests.
    expect(balancer.stats.accepted - accepted).toBeLessThanOrEqual(4);
  });

  it('carries a 16 MiB download and upload through Nginx intact', async () => {
    const down = await nginxGet(ng.httpPort, '/big');
    expect(sha(down.body)).toBe(sha(BIG));
    const up = await new Promise<Reply>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port: ng.httpPort, path: '/sha', method: 'POST', headers: { host: 'svc' } });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      });
      req.on('error', reject);
      req.end(BIG);
    });
    expect(up.status).toBe(200);
    expect(JSON.parse(up.body.toString())).toMatchObject({ n: BIG.length, sha: sha(BIG) });
  });
});

function nginxGet(port: number, p: string, agent?: Agent): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path: p, headers: { host: 'svc' }, agent });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}
