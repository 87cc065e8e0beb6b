// A WebSocket through the in-server proxy is closed after the read timeout with no traffic in
// either direction, and stays open while either side keeps talking. A raw TCP "replica" that
// answers 101 and then sends a byte when told, and a raw client: the proxy pipes bytes, so which
// side sends is exactly what the test chooses. Time is the daemon's clock, moved by the test:
// the read timeout is far longer than the test runs, so only the test's jumps can reach it.

import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JumpClock } from '../helpers/fake-clock.js';
import { eventually } from '../helpers/nginx.js';
import { directService, doc, startHarness, type Harness } from './harness.js';

const READ_TIMEOUT_MS = 600_000;
/** A talker's pause: well inside the timeout. */
const PAUSE_MS = READ_TIMEOUT_MS * 0.6;

interface ReplicaSide {
  socket: Socket;
  received: number;
  closed: boolean;
}

let h: Harness;
let replica: Server;
const clock = new JumpClock();
const sides: ReplicaSide[] = [];
const clients = new Set<Socket>();

/** Answers 101 to any request, then only counts what it receives. */
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
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

interface Client {
  socket: Socket;
  received: string;
  closed: boolean;
}

/** A raw upgrade through the proxy; resolves once the 101 came back. */
async function openThroughProxy(): Promise<{ c: Client; side: ReplicaSide }> {
  const url = new URL(h.url);
  const socket = connect(Number(url.port), url.hostname);
  clients.add(socket);
  const c: Client = { socket, received: '', closed: false };
  socket.on('data', (d: Buffer) => (c.received += d.toString('latin1')));
  socket.on('close', () => (c.closed = true));
  socket.on('error', () => socket.destroy());
  const before = sides.length;
  socket.write(
    'GET /proxy/services/test-proj/ws/chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n' +
      'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n',
  );
  await eventually(
    () => (c.received.startsWith('HTTP/1.1 101') ? true : c.closed ? Promise.reject(new Error(c.received)) : undefined),
    10_000,
  );
  return { c, side: sides[before]! };
}

/** Both ends still open after a round trip through the proxy (a close in flight would show). */
async function stillOpen(c: Client, side: ReplicaSide): Promise<void> {
  const n = side.received;
  c.socket.write('p');
  await eventually(() => (side.received > n || side.closed ? true : undefined));
  expect(side.closed).toBe(false);
  expect(c.closed).toBe(false);
}

describe('WebSocket idle timeout (= the read timeout)', () => {
  beforeAll(async () => {
    replica = await startRawReplica();
    const port = (replica.address() as { port: number }).port;
    h = await startHarness({ readTimeoutMs: READ_TIMEOUT_MS }, { clock });
    await h.put(doc([directService('test-proj', 'ws', port)]));
  });

  afterAll(async () => {
    for (const c of clients) c.destroy();
    for (const s of sides) s.socket.destroy();
    await h?.close();
    await new Promise((r) => replica?.close(r));
  });

  it('closes both sides when neither sends anything for the read timeout', async () => {
    const { c, side } = await openThroughProxy();
    clock.jump(READ_TIMEOUT_MS - 1_000);
    await stillOpen(c, side); // the probe's byte is traffic: the timeout counts from it
    clock.jump(READ_TIMEOUT_MS);
    await eventually(() => (c.closed && side.closed ? true : undefined));
  });

  it('keeps a connection open while only the client talks', async () => {
    const { c, side } = await openThroughProxy();
    for (let i = 0; i < 4; i++) {
      const n = side.received;
      c.socket.write('c');
      await eventually(() => (side.received > n ? true : undefined));
      clock.jump(PAUSE_MS);
    }
    await stillOpen(c, side);
    c.socket.destroy(); // and a client hanging up closes the replica's side
    await eventually(() => (side.closed ? true : undefined));
  });

  it('keeps a connection open while only the replica talks, and closes it once it stops', async () => {
    const { c, side } = await openThroughProxy();
    for (let i = 0; i < 4; i++) {
      const n = c.received.length;
      side.socket.write('r');
      await eventually(() => (c.received.length > n ? true : undefined));
      clock.jump(PAUSE_MS);
    }
    expect(c.closed).toBe(false);
    expect(side.closed).toBe(false);
    expect(c.received).toMatch(/\r\n\r\nr{4}$/);
    clock.jump(READ_TIMEOUT_MS); // silence from here on: the idle timeout applies
    await eventually(() => (c.closed && side.closed ? true : undefined));
  });
});
