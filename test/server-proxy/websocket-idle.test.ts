// A WebSocket through the in-server proxy is closed after the read timeout with no traffic in
// either direction, and stays open while either side keeps talking. A raw TCP "replica" that
// answers 101 and then talks (or not) as the path says, and a raw client: the proxy pipes bytes,
// so which side sends is exactly what the test chooses.

import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { directService, doc, startHarness, type Harness } from './harness.js';

const READ_TIMEOUT_MS = 1_500;
/** Far below the timeout, so a busy machine's scheduling delays cannot make a talker look idle. */
const TICK_MS = 150;
/** Several read timeouts: a connection still open after this is not being timed out. */
const TALK_FOR_MS = 4 * READ_TIMEOUT_MS;

interface ReplicaSide {
  socket: Socket;
  received: number;
  closed: boolean;
}

let h: Harness;
let replica: Server;
const sides: ReplicaSide[] = [];
const timers = new Set<NodeJS.Timeout>();
const clients = new Set<Socket>();

/** Answers 101 to any request; on …/talk it then sends a byte every TICK_MS, otherwise nothing. */
function startRawReplica(): Promise<Server> {
  const server = createServer((socket) => {
    const side: ReplicaSide = { socket, received: 0, closed: false };
    sides.push(side);
    let head = '';
    let upgraded = false;
    socket.on('error', () => socket.destroy());
    socket.on('close', () => (side.closed = true));
    socket.on('data', (d: Buffer) => {
      if (upgraded) return void (side.received += d.length);
      head += d.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      upgraded = true;
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
      if (/^GET \S*\/talk /.test(head)) every(() => !socket.destroyed && socket.write('r'));
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

function every(tick: () => unknown): void {
  const t = setInterval(tick, TICK_MS);
  timers.add(t);
}

interface Client {
  socket: Socket;
  received: string;
  closed: boolean;
}

/** A raw upgrade through the proxy; resolves once the 101 came back. */
async function openThroughProxy(path: string): Promise<Client> {
  const url = new URL(h.url);
  const socket = connect(Number(url.port), url.hostname);
  clients.add(socket);
  const c: Client = { socket, received: '', closed: false };
  socket.on('data', (d: Buffer) => (c.received += d.toString('latin1')));
  socket.on('close', () => (c.closed = true));
  socket.on('error', () => socket.destroy());
  socket.write(
    `GET /proxy/services/test-proj/ws/${path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
      'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n',
  );
  await eventually(
    () => (c.received.startsWith('HTTP/1.1 101') ? true : c.closed ? Promise.reject(new Error(c.received)) : undefined),
    10_000,
  );
  return c;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('WebSocket idle timeout (= the read timeout)', () => {
  beforeAll(async () => {
    replica = await startRawReplica();
    const port = (replica.address() as { port: number }).port;
    h = await startHarness({ readTimeoutMs: READ_TIMEOUT_MS });
    await h.put(doc([directService('test-proj', 'ws', port)]));
  });

  afterAll(async () => {
    for (const t of timers) clearInterval(t);
    for (const c of clients) c.destroy();
    for (const s of sides) s.socket.destroy();
    await h?.close();
    await new Promise((r) => replica?.close(r));
  });

  it('closes both sides when neither sends anything for the read timeout', async () => {
    const c = await openThroughProxy('quiet');
    const side = sides.at(-1)!;
    await eventually(() => (c.closed && side.closed ? true : undefined), 10 * READ_TIMEOUT_MS);
  });

  it('keeps a connection open while only the client talks', async () => {
    const c = await openThroughProxy('quiet');
    const side = sides.at(-1)!;
    every(() => !c.socket.destroyed && c.socket.write('c'));
    await sleep(TALK_FOR_MS);
    expect(c.closed).toBe(false);
    expect(side.closed).toBe(false);
    expect(side.received).toBeGreaterThan(0);
    c.socket.destroy(); // and a client hanging up closes the replica's side
    await eventually(() => (side.closed ? true : undefined));
  });

  it('keeps a connection open while only the replica talks, and closes it once it stops', async () => {
    const c = await openThroughProxy('talk');
    const side = sides.at(-1)!;
    await sleep(TALK_FOR_MS);
    expect(c.closed).toBe(false);
    expect(side.closed).toBe(false);
    expect(c.received).toMatch(/\r\n\r\nr+$/);
    for (const t of timers) clearInterval(t); // silence from here on: the idle timeout applies
    await eventually(() => (c.closed && side.closed ? true : undefined), 10 * READ_TIMEOUT_MS);
  });
});
