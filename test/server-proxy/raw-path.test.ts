// The raw fast path (src/server-proxy/raw/connection.ts), byte for byte over real sockets: what it
// serves itself (keep-alive, pipelining, small bodies, HEAD/204, chunked replica answers,
// Connection: close) and what it hands to Node's server mid-connection (other routes, a body
// still on its way, a head our parser refuses), plus shutdown with idle connections open.

import { createServer, type Server } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { fastify } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Replicas } from '../../src/dataplane/index.js';
import { registerServerProxy } from '../../src/server-proxy/plugin.js';
import { emptyState } from '../../src/spec/types.js';
import { close } from '../helpers/http.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { startPluginApp, type PluginApp } from './harness.js';

interface Resp {
  status: number;
  head: string;
  headers: Record<string, string>;
  body: string;
}

/** Responses in `text` (latin1), as many as are complete; `heads` marks answers to HEAD requests. */
function parseResponses(text: string, heads: ReadonlySet<number> = new Set()): Resp[] {
  const out: Resp[] = [];
  let p = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', p);
    if (end === -1) return out;
    const head = text.slice(p, end);
    const [statusLine, ...lines] = head.split('\r\n');
    const status = Number(statusLine!.split(' ')[1]);
    const headers: Record<string, string> = {};
    for (const l of lines) headers[l.slice(0, l.indexOf(':')).toLowerCase()] = l.slice(l.indexOf(':') + 1).trim();
    let q = end + 4;
    let body = '';
    if (heads.has(out.length) || status === 204 || status === 304) {
      // no body
    } else if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (text.length < q + n) return out;
      body = text.slice(q, q + n);
      q += n;
    } else if (headers['transfer-encoding'] === 'chunked') {
      for (;;) {
        const eol = text.indexOf('\r\n', q);
        if (eol === -1) return out;
        const n = parseInt(text.slice(q, eol), 16);
        if (text.length < eol + 2 + n + 2) return out;
        body += text.slice(eol + 2, eol + 2 + n);
        q = eol + 2 + n + 2;
        if (n === 0) break;
      }
    } else return out;
    out.push({ status, head, headers, body });
    p = q;
  }
}

/** One client connection, reading everything it receives. */
class Conn {
  readonly socket: Socket;
  text = '';
  ended = false;
  constructor(port: number) {
    this.socket = netConnect(port, '127.0.0.1');
    this.socket.on('data', (c: Buffer) => (this.text += c.toString('latin1')));
    this.socket.on('end', () => (this.ended = true));
    this.socket.on('close', () => (this.ended = true));
  }
  send(s: string | Buffer): void {
    this.socket.write(s);
  }
  async responses(n: number, heads?: ReadonlySet<number>): Promise<Resp[]> {
    for (let i = 0; i < 500; i++) {
      const r = parseResponses(this.text, heads);
      if (r.length >= n) return r;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error(`expected ${n} responses, got: ${JSON.stringify(this.text)}`);
  }
  async closed(): Promise<boolean> {
    for (let i = 0; i < 500 && !this.ended; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    return this.ended;
  }
}

const get = (path: string, extra = ''): string => `GET ${path} HTTP/1.1\r\nHost: h.example\r\n${extra}\r\n`;

describe('in-server proxy raw fast path', () => {
  let replica: Server;
  let proxy: PluginApp;
  let port: number;

  beforeAll(async () => {
    // A replica that echoes method, url and body; /chunked answers without a length, /empty 204.
    replica = createServer((req, res) => {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => {
        if (req.url === '/chunked') {
          res.write('first,');
          setTimeout(() => res.end('second'), 20);
          return;
        }
        if (req.url === '/cut' || req.url === '/head-only') {
          // The replica dies after promising 100 bytes: with 10 of them, or with none.
          res.writeHead(200, { 'content-length': 100 });
          if (req.url === '/cut') res.write('0123456789');
          else res.flushHeaders();
          setTimeout(() => res.socket?.destroy(), 20);
          return;
        }
        if (req.url === '/empty') {
          res.writeHead(204).end();
          return;
        }
        res.setHeader('content-type', 'application/json');
        res.end(
          JSON.stringify({
            method: req.method,
            url: req.url,
            body: Buffer.concat(parts).toString('utf8'),
            xff: req.headers['x-forwarded-for'],
          }),
        );
      });
    });
    await new Promise<void>((resolve) => replica.listen(0, '127.0.0.1', resolve));
    proxy = await startPluginApp((replica.address() as { port: number }).port, { clientMaxBodySize: 1 << 20 });
    port = proxy.port;
  });
  afterAll(async () => {
    await proxy.app.close();
    await close(replica);
  });

  it('serves keep-alive requests on one connection, with our Date and keep-alive headers', async () => {
    const before = proxy.connects();
    const c = new Conn(port);
    for (let i = 0; i < 3; i++) {
      c.send(get(`/proxy/services/p/r/k/${i}?x=1`));
      const r = (await c.responses(i + 1))[i]!;
      expect(r.status).toBe(200);
      expect(JSON.parse(r.body)).toMatchObject({ method: 'GET', url: `/k/${i}?x=1`, xff: '127.0.0.1' });
      expect(r.headers.connection).toBe('keep-alive');
      expect(r.headers['keep-alive']).toMatch(/^timeout=\d+$/);
      expect(r.headers.date).toBe(new Date(Date.parse(r.headers.date!)).toUTCString());
      expect(r.headers.server).toBeUndefined();
    }
    expect(proxy.connects() - before).toBeLessThanOrEqual(1); // the upstream connection is reused
    c.socket.destroy();
  });

  it('answers pipelined requests in order', async () => {
    const c = new Conn(port);
    c.send(get('/proxy/services/p/r/1') + get('/proxy/services/p/r/2') + get('/proxy/services/p/r/3'));
    const rs = await c.responses(3);
    expect(rs.map((r) => (JSON.parse(r.body) as { url: string }).url)).toEqual(['/1', '/2', '/3']);
    c.socket.destroy();
  });

  it('answers thousands of pipelined requests answered synchronously (404), reading paused and resumed', async () => {
    const c = new Conn(port);
    const n = 3000; // ~130 KB: more than the raw path buffers before it pauses reading
    c.send(get('/proxy/services/p/none/x').repeat(n));
    const rs = await c.responses(n);
    expect(rs.every((r) => r.status === 404 && r.body === '{"detail":"Service p/none not found"}')).toBe(true);
    c.send(get('/proxy/services/p/r/after-many'));
    expect(JSON.parse((await c.responses(n + 1))[n]!.body)).toMatchObject({ url: '/after-many' });
    c.socket.destroy();
  });

  it('hands the connection to Node mid-way for another route, and keeps proxying there', async () => {
    const c = new Conn(port);
    c.send(get('/proxy/services/p/r/before'));
    await c.responses(1);
    c.send(get('/other'));
    expect(JSON.parse((await c.responses(2))[1]!.body)).toEqual({ fastify: true });
    c.send(get('/proxy/services/p/r/after'));
    const r = (await c.responses(3))[2]!;
    expect(JSON.parse(r.body)).toMatchObject({ url: '/after' });
    c.socket.destroy();
  });

  it('relays a small body sent with the head, and one that arrives later', async () => {
    const c = new Conn(port);
    c.send('POST /proxy/services/p/r/post HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello');
    expect(JSON.parse((await c.responses(1))[0]!.body)).toMatchObject({ method: 'POST', url: '/post', body: 'hello' });
    c.send('POST /proxy/services/p/r/late HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nwo');
    await new Promise((resolve) => setTimeout(resolve, 50));
    c.send('rld');
    expect(JSON.parse((await c.responses(2))[1]!.body)).toMatchObject({ method: 'POST', url: '/late', body: 'world' });
    c.socket.destroy();
  });

  it('serves a head that arrives in pieces', async () => {
    const c = new Conn(port);
    const head = get('/proxy/services/p/r/drip');
    for (const piece of [head.slice(0, 10), head.slice(10, 30), head.slice(30)]) {
      c.send(piece);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(JSON.parse((await c.responses(1))[0]!.body)).toMatchObject({ url: '/drip' });
    c.socket.destroy();
  });

  it('sends a replica answer without a length chunked, HEAD and 204 without a body', async () => {
    const c = new Conn(port);
    c.send(get('/proxy/services/p/r/chunked'));
    const [chunked] = await c.responses(1);
    expect(chunked!.headers['transfer-encoding']).toBe('chunked');
    expect(chunked!.body).toBe('first,second');
    c.send(get('/proxy/services/p/r/empty'));
    const empty = (await c.responses(2))[1]!;
    expect(empty.status).toBe(204);
    expect(empty.headers['transfer-encoding']).toBeUndefined();
    c.send(`HEAD /proxy/services/p/r/head HTTP/1.1\r\nHost: h\r\n\r\n`);
    const head = (await c.responses(3, new Set([2])))[2]!;
    expect(head.status).toBe(200);
    expect(head.headers['transfer-encoding']).toBeUndefined(); // Node's replica sends no length for HEAD either
    c.send(get('/proxy/services/p/r/next'));
    const next = (await c.responses(4, new Set([2])))[3]!;
    expect(JSON.parse(next.body)).toMatchObject({ url: '/next' }); // nothing stray after HEAD or 204
    c.socket.destroy();
  });

  it.each(['/cut', '/head-only'])('cuts the client off when the replica dies mid-response (%s)', async (path) => {
    const c = new Conn(port);
    c.send(get(`/proxy/services/p/r${path}`));
    expect(await c.closed()).toBe(true);
    // The head waits for the first body bytes (as with Node's ServerResponse): with none, nothing is sent.
    if (path === '/cut') expect(c.text).toMatch(/^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\n0123456789$/);
    else expect(c.text).toBe('');
    const again = new Conn(port);
    again.send(get('/proxy/services/p/r/alive'));
    expect(JSON.parse((await again.responses(1))[0]!.body)).toMatchObject({ url: '/alive' });
    again.socket.destroy();
  });

  it('closes after answering Connection: close', async () => {
    const c = new Conn(port);
    c.send(get('/proxy/services/p/r/bye', 'Connection: close\r\n'));
    const [r] = await c.responses(1);
    expect(r!.headers.connection).toBe('close');
    expect(await c.closed()).toBe(true);
  });

  it('leaves a head it refuses to Node, which answers 400', async () => {
    const c = new Conn(port);
    c.send('GET /proxy/services/p/r/x HTTP/1.1\r\nHost: h\r\nBad\x01Name: v\r\n\r\n');
    const [r] = await c.responses(1);
    expect(r!.status).toBe(400);
    expect(await c.closed()).toBe(true);
  });

  it('closes a connection idle past the keep-alive timeout, timed on its clock', async () => {
    const clock = new FakeClock();
    const own = await startPluginApp((replica.address() as { port: number }).port, { clientMaxBodySize: 1 << 20, clock });
    try {
      const keepAliveMs = own.app.server.keepAliveTimeout; // fastify's, 72 s
      const c = new Conn(own.port);
      c.send(get('/proxy/services/p/r/a'));
      expect((await c.responses(1))[0]!.status).toBe(200);
      clock.advance(keepAliveMs); // up to the timeout, not past it
      c.send(get('/proxy/services/p/r/b'));
      expect((await c.responses(2))[1]!.status).toBe(200);
      expect(c.ended).toBe(false);
      clock.advance(keepAliveMs + 1_000); // idle past it since the second answer: the next sweep closes it
      expect(await c.closed()).toBe(true);
    } finally {
      await own.app.close();
    }
  });

  it('closes idle raw connections at shutdown', async () => {
    const own = fastify();
    await registerServerProxy(own, {
      getState: () => emptyState(),
      replicas: new Replicas(),
      authorize: async () => 'allow',
    });
    await own.listen({ host: '127.0.0.1', port: 0 });
    const c = new Conn((own.server.address() as { port: number }).port);
    c.send(get('/proxy/services/p/none/'));
    expect((await c.responses(1))[0]!.status).toBe(404);
    await own.close(); // would wait for the keep-alive timeout if the idle connection stayed open
    expect(await c.closed()).toBe(true);
  });
});
