// Pieces of the gateway balancing tests: replicas that answer with their own name and count what
// they got (slow answers, streamed answers, SSE driven step by step by the test, a WebSocket that
// echoes), a client that keeps its connections to Nginx alive, and a minimal WebSocket client.

import { createHash, randomBytes } from 'node:crypto';
import { Agent, createServer, request as httpRequest, type Server, type ServerResponse } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { api, type TestGateway } from './gateway.js';
import { eventually } from './nginx.js';

// ── replicas ──────────────────────────────────────────────────────────────────────────────

export interface NamedReplica {
  name: string;
  port: number;
  server: Server;
  /** Every request it got: method and path, in order. */
  got: { method: string; url: string }[];
  /** TCP connections it accepted (Nginx-facing keep-alive reuse shows as few). */
  connections: number;
  /** WebSocket upgrades it accepted. */
  upgrades: number;
  /** Answers the SSE stream waiting at /sse with its next event (`data: <text>`); false when none waits. */
  sseSend(text: string): boolean;
  /** Ends the SSE stream waiting at /sse. */
  sseEnd(): void;
  close(): Promise<void>;
}

export interface NamedReplicaOptions {
  port?: number;
  /** Every plain answer waits this long first. */
  delayMs?: number;
}

/**
 * An HTTP replica on 127.0.0.1 answering `<name>` (header x-replica too). Paths:
 * `/stream?chunks=N&every=MS` a chunked answer of N lines `<name> <i>\n`; `/sse` an event stream
 * the test drives with sseSend(); an `Upgrade: websocket` is accepted and each text frame is
 * echoed as `<name>:<text>`.
 */
export async function startNamedReplica(name: string, o: NamedReplicaOptions = {}): Promise<NamedReplica> {
  const got: NamedReplica['got'] = [];
  let sse: ServerResponse | undefined;
  const server = createServer((req, res) => {
    got.push({ method: req.method ?? '', url: req.url ?? '' });
    const url = new URL(req.url ?? '/', 'http://x');
    req.resume();
    if (url.pathname === '/stream') {
      const chunks = Number(url.searchParams.get('chunks') ?? 10);
      const every = Number(url.searchParams.get('every') ?? 300);
      res.writeHead(200, { 'content-type': 'text/plain', 'x-replica': name });
      let i = 0;
      const tick = (): void => {
        if (res.destroyed) return;
        res.write(`${name} ${i}\n`);
        if (++i === chunks) res.end();
        else setTimeout(tick, every);
      };
      tick();
      return;
    }
    if (url.pathname === '/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-replica': name });
      res.flushHeaders();
      sse = res;
      res.once('close', () => {
        if (sse === res) sse = undefined;
      });
      return;
    }
    const answer = (): void => {
      if (res.destroyed) return;
      res.writeHead(200, { 'content-type': 'text/plain', 'x-replica': name });
      res.end(name);
    };
    if (o.delayMs) setTimeout(answer, o.delayMs);
    else answer();
  });
  server.keepAliveTimeout = 60_000;
  const r: NamedReplica = {
    name,
    port: 0,
    server,
    got,
    connections: 0,
    upgrades: 0,
    sseSend: (text) => (sse ? (sse.write(`data: ${text}\n\n`), true) : false),
    sseEnd: () => sse?.end(),
    close: async () => {
      server.closeAllConnections();
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const sockets = new Set<Duplex>();
  server.on('connection', (s: Socket) => {
    r.connections++;
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  server.on('upgrade', (req, socket: Duplex) => {
    r.upgrades++;
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    const key = String(req.headers['sec-websocket-key'] ?? '');
    socket.write(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
        `Sec-WebSocket-Accept: ${wsAccept(key)}\r\nX-Replica: ${name}\r\n\r\n`,
    );
    const frames = new FrameReader(true, (text) => socket.write(frame(`${name}:${text}`, false)));
    socket.on('data', (d: Buffer) => frames.push(d));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(o.port ?? 0, '127.0.0.1', () => resolve());
  });
  r.port = (server.address() as { port: number }).port;
  return r;
}

/** How many requests each replica got since `before` (a snapshot of got.length). */
export function countsSince(replicas: NamedReplica[], before: number[]): number[] {
  return replicas.map((r, i) => r.got.length - (before[i] ?? 0));
}

// ── a keep-alive client ───────────────────────────────────────────────────────────────────

export interface KeptReply {
  status: number;
  replica: string;
  body: string;
}

/** A client of Nginx that keeps up to `connections` connections alive and reuses them. */
export class KeepAliveClient {
  readonly agent: Agent;
  /** Every connection to Nginx it opened. */
  readonly sockets = new Set<Socket>();

  constructor(
    readonly port: number,
    readonly host: string,
    connections = 1,
  ) {
    this.agent = new Agent({ keepAlive: true, maxSockets: connections, keepAliveMsecs: 1_000 });
  }

  request(path = '/', method = 'GET', body?: string): Promise<KeptReply> {
    return new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(body);
      const req = httpRequest({
        host: '127.0.0.1',
        port: this.port,
        path,
        method,
        agent: this.agent,
        headers: { host: this.host, ...(payload ? { 'content-length': String(payload.length) } : {}) },
      });
      req.on('socket', (s: Socket) => this.sockets.add(s));
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            replica: String(res.headers['x-replica'] ?? ''),
            body: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(payload);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

// ── WebSocket, by hand ────────────────────────────────────────────────────────────────────

/** The Sec-WebSocket-Accept for a key (RFC 6455 §4.2.2). */
function wsAccept(key: string): string {
  return createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
}

/** One text frame (< 126 bytes), masked as a client must. */
function frame(text: string, masked: boolean): Buffer {
  const payload = Buffer.from(text);
  if (payload.length >= 126) throw new Error('frame too long for this test client');
  if (!masked) return Buffer.concat([Buffer.from([0x81, payload.length]), payload]);
  const mask = randomBytes(4);
  const out = Buffer.alloc(payload.length);
  for (let i = 0; i < payload.length; i++) out[i] = payload[i]! ^ mask[i % 4]!;
  return Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, out]);
}

/** Reassembles small text frames (masked or not) from a byte stream. */
class FrameReader {
  #buf = Buffer.alloc(0);
  constructor(
    readonly masked: boolean,
    readonly onText: (text: string) => void,
  ) {}

  push(d: Buffer): void {
    this.#buf = Buffer.concat([this.#buf, d]);
    for (;;) {
      if (this.#buf.length < 2) return;
      const len = this.#buf[1]! & 0x7f;
      const isMasked = (this.#buf[1]! & 0x80) !== 0;
      const head = 2 + (isMasked ? 4 : 0);
      if (this.#buf.length < head + len) return;
      let payload = this.#buf.subarray(head, head + len);
      if (isMasked) {
        const mask = this.#buf.subarray(2, 6);
        payload = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]!));
      }
      this.#buf = this.#buf.subarray(head + len);
      this.onText(payload.toString('utf8'));
    }
  }
}

export interface TestWebSocket {
  /** x-replica of the 101 answer. */
  replica: string;
  /** Sends a text frame and waits for its echo. */
  echo(text: string): Promise<string>;
  socket: Socket;
  close(): void;
}

/** Opens a WebSocket to Nginx at `port` for `host` (handshake by hand) and waits for the 101. */
export async function openWebSocket(port: number, host: string, path = '/ws'): Promise<TestWebSocket> {
  const socket = netConnect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  const key = randomBytes(16).toString('base64');
  const texts: string[] = [];
  let head = '';
  let rest = Buffer.alloc(0);
  let headDone = false;
  const reader = new FrameReader(false, (t) => texts.push(t));
  socket.on('data', (d: Buffer) => {
    if (headDone) return reader.push(d);
    rest = Buffer.concat([rest, d]);
    const end = rest.indexOf('\r\n\r\n');
    if (end === -1) return;
    head = rest.subarray(0, end).toString('latin1');
    headDone = true;
    reader.push(rest.subarray(end + 4));
  });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.write(
    `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
  );
  await eventually(() => (headDone ? true : undefined), 15_000);
  const status = Number(head.split(' ')[1]);
  if (status !== 101) throw new Error(`WebSocket handshake answered: ${head.split('\r\n')[0]}`);
  const accept = /\r\nsec-websocket-accept: *([^\r]+)/i.exec(head)?.[1];
  if (accept !== wsAccept(key)) throw new Error(`bad Sec-WebSocket-Accept: ${accept}`);
  const replica = /\r\nx-replica: *([^\r]+)/i.exec(head)?.[1] ?? '';
  return {
    replica,
    socket,
    echo: async (text) => {
      const n = texts.length;
      socket.write(frame(text, true));
      return eventually(() => (texts.length > n ? texts[n] : undefined), 15_000);
    },
    close: () => socket.destroy(),
  };
}

// ── gateway status ────────────────────────────────────────────────────────────────────────

interface StatusDoc {
  loops: Record<string, { objects: Record<string, { conditions: { type: string; status: string }[] }> }>;
}

/** The SSH loop reports the replica `main/<run>/<id>` Ready (direct ones too). */
export function replicaReady(status: unknown, key: string): boolean {
  const o = (status as StatusDoc).loops?.ssh?.objects?.[key];
  return o?.conditions.find((c) => c.type === 'Ready')?.status === 'True';
}

/** Every replica of `services` (by run, in project `main`) Ready in the gateway's /api/v1/status. */
export async function allReplicasReady(
  t: TestGateway,
  services: ReadonlyMap<string, readonly { id: string }[]>,
): Promise<true | undefined> {
  const s = await api(t, { path: '/api/v1/status' });
  for (const [run, replicas] of services) for (const x of replicas) if (!replicaReady(s.json, `main/${run}/${x.id}`)) return undefined;
  return true;
}

/** Waits until the site at `host` answers 200 from every replica named in `names`. */
export async function answersFrom(port: number, host: string, names: string[]): Promise<void> {
  const client = new KeepAliveClient(port, host, 4);
  try {
    const seen = new Set<string>();
    await eventually(async () => {
      const replies = await Promise.all(Array.from({ length: 4 }, () => client.request('/warm')));
      for (const x of replies) if (x.status === 200) seen.add(x.replica);
      return names.every((n) => seen.has(n)) ? true : undefined;
    }, 30_000);
  } finally {
    client.close();
  }
}
