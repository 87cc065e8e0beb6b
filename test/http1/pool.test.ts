// The HTTP/1.1 upstream client against real servers: Node's http server for the ordinary cases,
// and a raw TCP server scripting what a replica might do wrong (close a keep-alive connection as
// a request arrives, never answer, answer with junk).

import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect as netConnect, type Server as NetServer, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Http1Pool, type Http1Handler, type Http1PoolOptions, type Http1Request } from '../../src/http1/index.js';
import { request } from '../helpers/http1-request.js';
import { startScriptedReplica } from '../helpers/scripted-replica.js';

const MiB = 1024 * 1024;

interface Result {
  status: number;
  headers: string[];
  body: Buffer;
}

function connector(port: number, counter: { n: number }): () => Promise<Socket> {
  return () =>
    new Promise((resolve, reject) => {
      counter.n++;
      const s = netConnect(port, '127.0.0.1');
      s.once('connect', () => resolve(s)).once('error', reject);
    });
}

/** dispatch() as a promise collecting the whole body. */
function send(pool: Http1Pool, req: Partial<Http1Request>): Promise<Result> {
  return new Promise((resolve, reject) => {
    let head: Omit<Result, 'body'> | null = null;
    const chunks: Buffer[] = [];
    const handler: Http1Handler = {
      onResponseStart: (status, _text, headers) => (head = { status, headers }),
      onResponseData: (c) => chunks.push(c) > 0,
      onResponseEnd: () => resolve({ ...head!, body: Buffer.concat(chunks) }),
      onResponseError: reject,
    };
    pool.dispatch({ method: 'GET', path: '/', headers: ['Host', 'replica'], ...req }, handler);
  });
}

async function listen<T extends Server | NetServer>(server: T): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as { port: number }).port;
}

let http: Server;
let httpPort: number;
const held: ServerResponse[] = [];

beforeAll(async () => {
  http = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/hang') return void held.push(res);
    if (url.pathname === '/big') {
      // 32 MiB in 64 KiB writes, honouring backpressure.
      let left = 512;
      res.writeHead(200, { 'content-length': String(512 * 64 * 1024) });
      const more = (): void => {
        while (left > 0) {
          left--;
          if (!res.write(Buffer.alloc(64 * 1024, 'z'))) return void res.once('drain', more);
        }
        res.end();
      };
      return more();
    }
    if (url.pathname === '/stall') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first');
      return void held.push(res);
    }
    const hash = createHash('sha256');
    let bytes = 0;
    req.on('data', (c: Buffer) => {
      bytes += c.length;
      hash.update(c);
    });
    req.on('end', () => {
      const body = JSON.stringify({ method: req.method, url: req.url, headers: req.headers, bytes, sha256: hash.digest('hex') });
      res.writeHead(200, { 'content-type': 'application/json', 'set-cookie': ['a=1', 'b=2'] });
      res.end(req.method === 'HEAD' ? undefined : body);
    });
  });
  httpPort = await listen(http);
});

afterAll(async () => {
  for (const r of held) r.destroy();
  http.closeAllConnections();
  await new Promise((r) => http.close(r));
});

function pool(o: Partial<Http1PoolOptions> = {}, counter = { n: 0 }): Http1Pool {
  return new Http1Pool({ connect: connector(httpPort, counter), ...o });
}

describe('against a Node http server', () => {
  it('reuses one keep-alive connection for sequential requests; HEAD has no body', async () => {
    const n = { n: 0 };
    const p = pool({}, n);
    for (let i = 0; i < 5; i++) {
      const r = await send(p, { path: `/x/${i}?q=${i}`, headers: ['Host', 'h.example', 'X-Trace', String(i)] });
      const e = JSON.parse(r.body.toString()) as { url: string; headers: Record<string, string> };
      expect(e.url).toBe(`/x/${i}?q=${i}`);
      expect(e.headers.host).toBe('h.example');
      expect(e.headers['x-trace']).toBe(String(i));
      expect(r.headers.filter((_, j) => j % 2 === 0 && r.headers[j]!.toLowerCase() === 'set-cookie')).toHaveLength(2);
    }
    const head = await send(p, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.body.length).toBe(0);
    expect((await send(p, {})).status).toBe(200);
    expect(n.n).toBe(1);
    await p.close();
    expect(p.connections).toBe(0);
  });

  it('queues beyond maxConnections and serves everything', async () => {
    const n = { n: 0 };
    const p = pool({ maxConnections: 3 }, n);
    const rs = await Promise.all(Array.from({ length: 40 }, (_, i) => send(p, { path: `/${i}` })));
    expect(rs.map((r) => (JSON.parse(r.body.toString()) as { url: string }).url)).toEqual(Array.from({ length: 40 }, (_, i) => `/${i}`));
    expect(n.n).toBeLessThanOrEqual(3);
    await p.close();
  });

  it('sends bodies: Buffer and string with a length, a stream with its Content-Length, a stream chunked', async () => {
    const p = pool();
    const data = Buffer.alloc(3 * MiB + 17, 'q');
    const sha = createHash('sha256').update(data).digest('hex');
    const pieces = (): Readable => Readable.from([data.subarray(0, MiB), data.subarray(MiB, 2 * MiB), data.subarray(2 * MiB)]);
    const cases: Partial<Http1Request>[] = [
      { method: 'POST', body: data },
      { method: 'PUT', body: data.toString('latin1') },
      { method: 'POST', body: pieces(), headers: ['Host', 'r', 'Content-Length', String(data.length)] },
      { method: 'PATCH', body: pieces() },
    ];
    for (const c of cases) {
      const e = JSON.parse((await send(p, c)).body.toString()) as { bytes: number; sha256: string; headers: Record<string, string> };
      expect(e.bytes).toBe(data.length);
      expect(e.sha256).toBe(sha);
    }
    const chunked = JSON.parse((await send(p, { method: 'POST', body: pieces() })).body.toString()) as { headers: Record<string, string> };
    expect(chunked.headers['transfer-encoding']).toBe('chunked');
    const empty = JSON.parse((await send(p, { method: 'POST' })).body.toString()) as { headers: Record<string, string> };
    expect(empty.headers['content-length']).toBe('0');
    await p.close();
  });

  it('a stream shorter than its Content-Length fails the request and the connection', async () => {
    const p = pool();
    await expect(
      send(p, { method: 'POST', body: Readable.from([Buffer.alloc(10)]), headers: ['Host', 'r', 'Content-Length', '20'] }),
    ).rejects.toMatchObject({ code: 'DP_HTTP1_BODY_LENGTH' });
    expect((await send(p, {})).status).toBe(200);
    await p.close();
  });

  it('pauses the replica while the handler is behind (32 MiB read in small steps)', async () => {
    const p = pool();
    const got = await new Promise<number>((resolve, reject) => {
      let bytes = 0;
      const ex = p.dispatch(
        { method: 'GET', path: '/big', headers: ['Host', 'r'] },
        {
          onResponseStart: () => undefined,
          onResponseData: (c) => {
            bytes += c.length;
            setTimeout(() => ex.resume(), 0);
            return false;
          },
          onResponseEnd: () => resolve(bytes),
          onResponseError: reject,
        },
      );
    });
    expect(got).toBe(32 * MiB);
    // The connection is reusable after a paused response.
    expect((await send(p, {})).status).toBe(200);
    await p.close();
  });

  it('headers timeout, body timeout; neither connection is reused', async () => {
    const n = { n: 0 };
    const p = pool({ headersTimeoutMs: 200, bodyTimeoutMs: 200 }, n);
    await expect(send(p, { path: '/hang' })).rejects.toMatchObject({ code: 'DP_HTTP1_HEADERS_TIMEOUT' });
    const stalled = await new Promise<{ data: string; err: Error }>((resolve) => {
      let data = '';
      p.dispatch(
        { method: 'GET', path: '/stall', headers: ['Host', 'r'] },
        {
          onResponseStart: () => undefined,
          onResponseData: (c) => (data += c.toString()).length > 0,
          onResponseEnd: () => undefined,
          onResponseError: (err) => resolve({ data, err }),
        },
      );
    });
    expect(stalled.data).toBe('first');
    expect(stalled.err).toMatchObject({ code: 'DP_HTTP1_BODY_TIMEOUT' });
    expect((await send(p, {})).status).toBe(200);
    expect(n.n).toBe(3);
    await p.close();
  });

  it('an aborted exchange closes its connection (never reused half-read)', async () => {
    const n = { n: 0 };
    const p = pool({}, n);
    const err = await new Promise<Error>((resolve) => {
      const ex = p.dispatch(
        { method: 'GET', path: '/big', headers: ['Host', 'r'] },
        {
          onResponseStart: () => undefined,
          onResponseData: () => (ex.abort(), true),
          onResponseEnd: () => undefined,
          onResponseError: resolve,
        },
      );
    });
    expect(err).toMatchObject({ code: 'DP_HTTP1_ABORTED' });
    expect((await send(p, {})).status).toBe(200);
    expect(n.n).toBe(2);
    await p.close();
  });

  it('refuses headers that would break the framing', async () => {
    const p = pool();
    await expect(send(p, { headers: ['Host', 'r', 'X-Evil', 'a\r\nX-Injected: 1'] })).rejects.toMatchObject({
      code: 'DP_HTTP1_BAD_REQUEST',
    });
    await expect(send(p, { headers: ['Bad Name', 'v'] })).rejects.toMatchObject({ code: 'DP_HTTP1_BAD_REQUEST' });
    await expect(send(p, { path: '/a b' })).rejects.toMatchObject({ code: 'DP_HTTP1_BAD_REQUEST' });
    expect((await send(p, {})).status).toBe(200);
    await p.close();
  });

  it('request(): a streamed body, headers as an object, abort by signal', async () => {
    const p = pool();
    const r = await request(p, {
      method: 'POST',
      path: '/echo',
      headers: ['Host', 'r', 'Content-Type', 'application/json'],
      body: '{"a":1}',
    });
    expect(r.status).toBe(200);
    expect(r.headers['set-cookie']).toEqual(['a=1', 'b=2']);
    const chunks: Buffer[] = [];
    for await (const c of r.body) chunks.push(c as Buffer);
    expect((JSON.parse(Buffer.concat(chunks).toString()) as { bytes: number }).bytes).toBe(7);
    const ac = new AbortController();
    const hanging = request(p, { method: 'GET', path: '/hang', headers: ['Host', 'r'], signal: ac.signal });
    setTimeout(() => ac.abort(), 50);
    await expect(hanging).rejects.toBeDefined();
    await p.close();
  });

  it('a failed connect fails the request with its error; destroy() fails what waits', async () => {
    const p = new Http1Pool({ connect: () => Promise.reject(Object.assign(new Error('no ready replica'), { status: 503 })) });
    await expect(send(p, {})).rejects.toMatchObject({ status: 503 });
    const q = pool();
    const pending = send(q, { path: '/hang' }).catch((err: unknown) => err);
    await new Promise((r) => setTimeout(r, 50));
    await q.destroy();
    expect(await pending).toMatchObject({ code: 'DP_HTTP1_POOL_CLOSED' });
  });
});

describe('against a scripted replica', () => {
  let raw: NetServer;
  let rawPort: number;
  /** What the replica does with the n-th request on a connection (0-based). */
  let script: (socket: Socket, nth: number, request: string) => void;
  const seen: string[] = [];

  beforeAll(async () => {
    const scripted = await startScriptedReplica((socket, nth, head) => {
      seen.push(head.split('\r\n')[0]!);
      script(socket, nth, head);
    });
    raw = scripted.server;
    rawPort = scripted.port;
  });
  afterAll(() => new Promise((r) => raw.close(r)));

  const rawPool = (counter: { n: number }, o: Partial<Http1PoolOptions> = {}): Http1Pool =>
    new Http1Pool({ connect: connector(rawPort, counter), ...o });

  it('a keep-alive connection closed as a request arrives: GET is retried once on a new one, a streamed POST fails', async () => {
    script = (socket, nth) => {
      if (nth === 0) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      else socket.destroy(); // the replica's idle timeout won the race
    };
    const n = { n: 0 };
    const p = rawPool(n);
    expect((await send(p, {})).body.toString()).toBe('ok');
    expect((await send(p, { path: '/again' })).body.toString()).toBe('ok');
    expect(n.n).toBe(2);
    await expect(send(p, { method: 'POST', body: Readable.from([Buffer.from('x')]) })).rejects.toMatchObject({ code: 'DP_HTTP1_CLOSED' });
    await p.close();
  });

  it('a connection that dies after part of the answer is not retried', async () => {
    seen.length = 0;
    script = (socket, nth) => {
      if (nth === 0) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      else socket.end('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart');
    };
    const p = rawPool({ n: 0 });
    await send(p, {});
    await expect(send(p, {})).rejects.toMatchObject({ code: 'DP_HTTP1_BAD_RESPONSE' });
    expect(seen).toHaveLength(2);
    await p.close();
  });

  it('oversize or malformed heads fail the request and the connection; the next request works', async () => {
    let bad = true;
    script = (socket) => {
      if (bad) socket.write(`HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n`);
      else socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    };
    const n = { n: 0 };
    const p = rawPool(n);
    await expect(send(p, {})).rejects.toMatchObject({ code: 'DP_HTTP1_BAD_RESPONSE' });
    bad = false;
    expect((await send(p, {})).body.toString()).toBe('ok');
    expect(n.n).toBe(2);
    await p.close();
  });

  it('a body until close, a Connection: close answer, and 100 Continue before the answer', async () => {
    script = (socket, _nth, req) => {
      if (req.includes('/until-close')) socket.end('HTTP/1.1 200 OK\r\n\r\nall of it');
      else if (req.includes('/close')) socket.write('HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok');
      else socket.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes');
    };
    const n = { n: 0 };
    const p = rawPool(n);
    expect((await send(p, { path: '/until-close' })).body.toString()).toBe('all of it');
    expect((await send(p, { path: '/close' })).body.toString()).toBe('ok');
    expect((await send(p, { path: '/continue' })).body.toString()).toBe('yes');
    expect((await send(p, { path: '/continue' })).body.toString()).toBe('yes');
    expect(n.n).toBe(3);
    await p.close();
  });

  it('idle connections close after keepAliveTimeoutMs', async () => {
    script = (socket) => socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    const p = rawPool({ n: 0 }, { keepAliveTimeoutMs: 100 });
    await send(p, {});
    expect(p.connections).toBe(1);
    await new Promise((r) => setTimeout(r, 400));
    expect(p.connections).toBe(0);
    await p.close();
  });
});
