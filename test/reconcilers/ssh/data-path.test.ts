// The data-path pieces tuned for throughput through SSH tunnels: pooled padding randomness,
// write coalescing on the SSH socket, HTTP through a balancer socket (large bodies both ways,
// with backpressure), and binding many balancer sockets at once (a cold converge of
// thousands of services).

import { randomBytes, createHash } from 'node:crypto';
import { mkdirSync, statSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, request as httpRequest, type Server as HttpServer } from 'node:http';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, Replicas, type Upstream } from '../../../src/dataplane/index.js';
import { coalesceWrites } from '../../../src/reconcilers/ssh/ssh-chain.js';
import { pooledRandomFill } from '../../../src/ssh2.js';
import { tmpDir } from '../../helpers/tmp.js';

describe('pooledRandomFill', () => {
  /** A stand-in CSPRNG that counts: every byte it ever produced is distinct (mod 256 per call). */
  const counting = (): { fill: (buf: Buffer, offset?: number, size?: number) => Buffer; calls: number[] } => {
    let next = 0;
    const calls: number[] = [];
    const fill = (buf: Buffer, offset = 0, size = buf.length - offset): Buffer => {
      calls.push(size);
      for (let i = 0; i < size; i++) buf[offset + i] = next++ & 0xff;
      return buf;
    };
    return { fill, calls };
  };

  it('fills exactly the requested range, from one bulk draw', () => {
    const c = counting();
    const fill = pooledRandomFill(c.fill as never);
    const buf = Buffer.alloc(32, 0xee);
    fill(buf, 5, 11);
    expect([...buf.subarray(0, 5)]).toEqual([0xee, 0xee, 0xee, 0xee, 0xee]);
    expect([...buf.subarray(5, 16)]).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect([...buf.subarray(16)]).toEqual(new Array(16).fill(0xee));
    expect(c.calls).toEqual([16 * 1024]);
  });

  it('never hands out a byte twice and draws again when the pool is used up', () => {
    const c = counting();
    const fill = pooledRandomFill(c.fill as never);
    const seen: number[] = [];
    for (let i = 0; i < 2_000; i++) {
      const b = Buffer.alloc(19);
      fill(b, 0, 19);
      seen.push(...b);
    }
    // 2,000 × 19 bytes = 38,000: three bulk draws of 16 KiB, consumed in order.
    expect(c.calls).toEqual([16384, 16384, 16384]);
    const firstPool = seen.slice(0, Math.floor(16384 / 19) * 19);
    expect(firstPool.every((v, i) => v === (i & 0xff))).toBe(true);
  });

  it('passes large or unusual requests straight to the CSPRNG', () => {
    const c = counting();
    const fill = pooledRandomFill(c.fill as never);
    fill(Buffer.alloc(1024));
    fill(new Uint8Array(8) as unknown as Buffer, 0, 8);
    expect(c.calls).toEqual([1024, 8]);
  });
});

describe('coalesceWrites', () => {
  let server: Server;
  let port = 0;
  const received: Buffer[] = [];
  beforeAll(async () => {
    server = createServer((s) => s.on('data', (d: Buffer) => received.push(d)));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('holds the writes of one event-loop turn and sends them, in order, after it', async () => {
    const sock = coalesceWrites(connect({ host: '127.0.0.1', port, noDelay: true }));
    await new Promise((r) => sock.once('connect', r));
    sock.write(Buffer.from('a'));
    sock.write(Buffer.from('b'));
    expect(sock.writableCorked).toBe(1);
    expect(sock.writableLength).toBe(2);
    await new Promise((r) => setImmediate(r));
    expect(sock.writableCorked).toBe(0);
    sock.write(Buffer.from('c'));
    await new Promise<void>((r) => sock.end(() => r()));
    const until = Date.now() + 5_000;
    while (Buffer.concat(received).toString() !== 'abc' && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
    expect(Buffer.concat(received).toString()).toBe('abc');
  });
});

describe('HTTP through the balancer socket', () => {
  let replica: HttpServer;
  let balancer: Balancer;
  let tmp: ReturnType<typeof tmpDir>;
  const payload = randomBytes(16 * 1024 * 1024);
  const digest = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
  beforeAll(async () => {
    tmp = tmpDir('dp-splice-');
    // Hashes an upload, serves the payload as a download; 16 MiB is far beyond every socket
    // buffer, so both directions hit backpressure.
    replica = createHttpServer((req, res) => {
      if (req.method === 'GET') return void res.end(payload);
      const h = createHash('sha256');
      let n = 0;
      req.on('data', (d: Buffer) => {
        h.update(d);
        n += d.length;
      });
      req.on('end', () => res.end(JSON.stringify({ n, sha: h.digest('hex') })));
    });
    await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
    const port = (replica.address() as { port: number }).port;
    const replicas = new Replicas();
    balancer = new Balancer({ socketDir: tmp.dir, replicas });
    const upstream: Upstream = {
      isReady: () => true,
      open: () =>
        new Promise((resolve, reject) => {
          const s = connect({ host: '127.0.0.1', port });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        }),
    };
    replicas.set('p/svc', 'r1', upstream);
    expect(await balancer.listenAll(['p/svc'])).toEqual(new Map());
  });
  afterAll(async () => {
    await balancer.close();
    replica.closeAllConnections();
    await new Promise<void>((r) => replica.close(() => r()));
    tmp.cleanup();
  });

  const call = (method: string, body?: Buffer): Promise<{ status: number; body: Buffer }> =>
    new Promise((resolve, reject) => {
      const req = httpRequest({ socketPath: balancer.socketPathFor('p/svc'), method, path: '/data', headers: { host: 'svc' } });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
      });
      req.on('error', reject);
      req.end(body);
    });

  it('carries a 16 MiB upload and a 16 MiB download intact', async () => {
    const up = await call('POST', payload);
    expect(up.status).toBe(200);
    expect(JSON.parse(up.body.toString())).toEqual({ n: payload.length, sha: digest(payload) });
    const down = await call('GET');
    expect(down.status).toBe(200);
    expect(down.body.length).toBe(payload.length);
    expect(digest(down.body)).toBe(digest(payload));
  });
});

describe('Balancer.listenAll', () => {
  let tmp: ReturnType<typeof tmpDir>;
  let balancer: Balancer;
  beforeAll(() => {
    tmp = tmpDir('dp-listen-');
    balancer = new Balancer({ socketDir: join(tmp.dir, 'sockets'), replicas: new Replicas() });
  });
  afterAll(async () => {
    await balancer.close();
    tmp.cleanup();
  });

  it('binds many sockets at once (mode 0600), replacing a file left at a path, and is idempotent', async () => {
    const keys = Array.from({ length: 40 }, (_, i) => `p/svc-${i}`);
    // A previous run's socket file, nobody listening on it.
    mkdirSync(join(tmp.dir, 'sockets'), { recursive: true });
    writeFileSync(balancer.socketPathFor(keys[7]!), '');
    const failed = await balancer.listenAll(keys);
    expect([...failed]).toEqual([]);
    expect(balancer.listening().sort()).toEqual([...keys].sort());
    for (const k of keys) {
      const st = statSync(balancer.socketPathFor(k));
      expect(st.isSocket()).toBe(true);
      expect(st.mode & 0o777).toBe(0o600);
    }
    // A connection reaches the balancer: no replica yet, so the 503 answer.
    const reply = await new Promise<string>((resolve, reject) => {
      const s = connect({ path: balancer.socketPathFor(keys[7]!) });
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString()));
      s.once('end', () => resolve(text));
      s.once('error', reject);
      s.end('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
    });
    expect(reply).toMatch(/^HTTP\/1\.1 503 /);
    // Twice at once, then again: no error, nothing bound twice.
    const [again, twice] = await Promise.all([balancer.listenAll(keys), balancer.listenAll([keys[0]!])]);
    expect([...again, ...twice]).toEqual([]);
    expect(balancer.listening()).toHaveLength(keys.length);
  });
});
