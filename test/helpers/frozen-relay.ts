// A TCP relay to a unix socket (a private postmaster's) that can be frozen: while frozen, no
// byte crosses in either direction and new connections are accepted but never answered — a
// network partition as a client sees it, its TCP connections up and nothing coming back.
// Thawing delivers what was held, in order, as a healed network would.

import { connect, createServer, type Socket } from 'node:net';

export interface FrozenRelay {
  port: number;
  freeze(): void;
  thaw(): void;
  close(): Promise<void>;
}

export async function startFrozenRelay(socketPath: string): Promise<FrozenRelay> {
  let frozen = false;
  const sockets = new Set<Socket>();
  const held: (() => void)[] = [];
  const track = (s: Socket): Socket => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    return s;
  };
  const forward = (from: Socket, to: Socket): void => {
    const queue: Buffer[] = [];
    from.on('data', (d: Buffer) => (frozen ? queue.push(d) : to.write(d)));
    held.push(() => {
      for (const d of queue.splice(0)) to.write(d);
    });
    from.once('close', () => to.destroy());
  };
  const server = createServer((client) => {
    const upstream = track(connect(socketPath));
    forward(track(client), upstream);
    forward(upstream, client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    freeze: () => {
      frozen = true;
    },
    thaw: () => {
      frozen = false;
      for (const flush of held) flush();
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
