// The shared data-plane socket: one socket for every service, each request naming its service in
// X-Dstack-Proxy-Service. Real HTTP replicas on 127.0.0.1, raw bytes on the socket (one keep-alive
// connection carrying requests of several services, as Nginx's one pool does).

import { statSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, Replicas, SERVICE_HEADER } from '../../src/dataplane/index.js';
import { tmpDir } from '../helpers/tmp.js';
import { tcpUpstream } from '../helpers/replicas.js';

interface Replica {
  server: Server;
  port: number;
}

/** Answers with its name and the request's raw header lines; an Upgrade gets a 101 and the head it saw. */
async function startReplica(name: string): Promise<Replica> {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => res.end(JSON.stringify({ name, url: req.url, rawHeaders: req.rawHeaders })));
  });
  server.on('upgrade', (req: IncomingMessage, socket: Socket) => {
    socket.on('error', () => socket.destroy());
    socket.end(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n${name} ${JSON.stringify(req.rawHeaders)}`,
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as { port: number }).port };
}

/** Writes `bytes` on one connection and reads until `answers` responses came back, or the socket closed. */
function exchange(path: string, bytes: string, answers: number): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve, reject) => {
    const s = connect({ path });
    let text = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`timed out; got ${text}`));
    }, 10_000);
    const done = (closed: boolean): void => {
      clearTimeout(timer);
      s.destroy();
      resolve({ text, closed });
    };
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      if ((text.match(/HTTP\/1\.1 \d{3}[^\r]*\r\n[\s\S]*?\r\n\r\n/g) ?? []).length >= answers && bodiesComplete(text, answers)) done(false);
    });
    s.on('error', () => undefined);
    s.once('close', () => done(true));
    s.write(bytes);
  });
}

/** `n` responses with Content-Length bodies are all there. */
function bodiesComplete(text: string, n: number): boolean {
  let at = 0;
  for (let i = 0; i < n; i++) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end === -1) return false;
    const m = /content-length: (\d+)/i.exec(text.slice(at, end));
    at = end + 4 + (m ? Number(m[1]) : 0);
    if (at > text.length) return false;
  }
  return true;
}

function bodies(text: string): unknown[] {
  const out: unknown[] = [];
  let at = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end === -1) return out;
    const m = /content-length: (\d+)/i.exec(text.slice(at, end));
    const len = m ? Number(m[1]) : 0;
    out.push(JSON.parse(text.slice(end + 4, end + 4 + len)));
    at = end + 4 + len;
  }
}

const get = (path: string, service: string | null, extra = ''): string =>
  `GET ${path} HTTP/1.1\r\nHost: svc\r\n${service === null ? '' : `${SERVICE_HEADER}: ${service}\r\n`}${extra}\r\n`;

let tmp: ReturnType<typeof tmpDir>;
let a: Replica;
let b: Replica;
let replicas: Replicas;
let balancer: Balancer;
let sock: string;

beforeAll(async () => {
  tmp = tmpDir('dp-shared-');
  [a, b] = await Promise.all([startReplica('a'), startReplica('b')]);
  replicas = new Replicas();
  replicas.set('p/a', 'a', tcpUpstream(a.port));
  replicas.set('p/b', 'b', tcpUpstream(b.port));
  balancer = new Balancer({ socketDir: tmp.dir, replicas, shared: true });
  expect(await balancer.listenAll(['p/a', 'p/b', 'p/none'])).toEqual(new Map());
  sock = balancer.sharedSocketPath!;
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

describe('the shared data-plane socket', () => {
  it('is one socket for every service, owner-only without a group', () => {
    expect(sock).toBe(join(tmp.dir, 'dataplane.sock'));
    expect(balancer.socketPathFor('p/a')).toBe(sock);
    expect(balancer.socketPathFor('p/b')).toBe(sock);
    expect(statSync(sock).mode & 0o777).toBe(0o600);
    expect(balancer.listening().sort()).toEqual(['p/a', 'p/b', 'p/none']);
  });

  it('routes each request on one keep-alive connection by its header, and keeps the header from the replica', async () => {
    const accepted = balancer.stats.accepted;
    const r = await exchange(sock, get('/1', 'p/a') + get('/2', 'p/b') + get('/3', 'p/a', 'X-Tail: yes\r\n'), 3);
    expect(r.closed).toBe(false);
    expect(balancer.stats.accepted - accepted).toBe(1);
    const got = bodies(r.text) as { name: string; url: string; rawHeaders: string[] }[];
    expect(got.map((g) => [g.name, g.url])).toEqual([
      ['a', '/1'],
      ['b', '/2'],
      ['a', '/3'],
    ]);
    for (const g of got) expect(g.rawHeaders.map((h) => h.toLowerCase())).not.toContain('x-dstack-proxy-service');
    expect(got[2]!.rawHeaders).toEqual(expect.arrayContaining(['Host', 'svc', 'X-Tail', 'yes']));
  });

  it('reads the header in any case and position', async () => {
    const r = await exchange(sock, 'GET /x HTTP/1.1\r\nx-dstack-proxy-SERVICE: p/b\r\nHost: svc\r\n\r\n', 1);
    expect((bodies(r.text)[0] as { name: string }).name).toBe('b');
  });

  it.each([
    ['without the header', get('/', null)],
    ['with the header twice', get('/', 'p/a', `${SERVICE_HEADER}: p/b\r\n`)],
    ['with a value that is no service key', get('/', 'p/a b')],
  ])('answers 400 %s and closes the connection', async (_name, bytes) => {
    const r = await exchange(sock, bytes + get('/after', 'p/a'), 2);
    expect(r.text).toMatch(/^HTTP\/1\.1 400 /);
    expect(r.text).toContain('Connection: close');
    expect(r.text).toContain(SERVICE_HEADER);
    expect(r.text).not.toContain('"name"'); // nothing reached a replica, the next request neither
    expect(r.closed).toBe(true);
  });

  it('answers an unknown service, or one without replicas, with the catalog 503 and keeps the connection', async () => {
    const r = await exchange(sock, get('/', 'p/unknown') + get('/', 'p/none') + get('/', 'p/a'), 3);
    expect(r.closed).toBe(false);
    const got = bodies(r.text);
    expect(got[0]).toEqual({ detail: 'Service p/unknown has no ready replica' });
    expect(got[1]).toEqual({ detail: 'Service p/none has no ready replica' });
    expect((got[2] as { name: string }).name).toBe('a');
    expect(r.text.match(/HTTP\/1\.1 503 /g)).toHaveLength(2);
  });

  it('pins an Upgrade to the named service, its head rewritten without the header', async () => {
    // The replica ends the stream after its answer: read until the close.
    const r = await exchange(sock, get('/ws', 'p/b', 'Upgrade: websocket\r\nConnection: Upgrade\r\n'), Infinity);
    expect(r.closed).toBe(true);
    expect(r.text).toMatch(/^HTTP\/1\.1 101 /);
    const seen = r.text.slice(r.text.indexOf('\r\n\r\n') + 4);
    expect(seen.startsWith('b ')).toBe(true);
    const raw = JSON.parse(seen.slice(2)) as string[];
    expect(raw).toEqual(['Host', 'svc', 'Upgrade', 'websocket', 'Connection', 'Upgrade']);
  });

  it('answers a service that left the document as the document says now, by the host', async () => {
    const on = (host: string, service: string): string => `GET /left HTTP/1.1\r\nHost: ${host}\r\n${SERVICE_HEADER}: ${service}\r\n\r\n`;
    try {
      // p/a left; p/b now has its host by-host (a rename), and the document still claims `kept`.
      replicas.setLeft('p/a', new Set(['kept.test', 'renamed.test']));
      replicas.setHostRoute('p/b', { host: 'renamed.test', cors: false, auth: false });
      const r = await exchange(
        sock,
        on('unclaimed.test', 'p/a') + on('Renamed.test:80', 'p/a') + on('kept.test', 'p/a') + get('/b', 'p/b'),
        4,
      );
      expect(r.closed).toBe(false);
      const heads = r.text.match(/HTTP\/1\.1 \d{3}[^\r]*/g);
      expect(heads).toEqual(['HTTP/1.1 404 Not Found', 'HTTP/1.1 200 OK', 'HTTP/1.1 200 OK', 'HTTP/1.1 200 OK']);
      // The unclaimed host goes back to Nginx's own 404, nothing of it relayed.
      expect(r.text.slice(0, r.text.indexOf('\r\n\r\n'))).toContain('X-Accel-Redirect: @dstack_unknown_host');
      expect((bodies(r.text.slice(r.text.indexOf('\r\n\r\n') + 4)) as { name: string }[]).map((g) => g.name)).toEqual(['b', 'a', 'b']);
      // Back in the document: its own again.
      replicas.clearLeft('p/a');
      const back = await exchange(sock, on('unclaimed.test', 'p/a'), 1);
      expect((bodies(back.text)[0] as { name: string }).name).toBe('a');
    } finally {
      replicas.clearLeft('p/a');
      replicas.setHostRoute('p/b', null);
    }
  });

  it('stops serving a service it unlistens, the socket staying for the others', async () => {
    await balancer.unlisten('p/none');
    expect(balancer.listening().sort()).toEqual(['p/a', 'p/b']);
    const r = await exchange(sock, get('/', 'p/a'), 1);
    expect((bodies(r.text)[0] as { name: string }).name).toBe('a');
  });
});
