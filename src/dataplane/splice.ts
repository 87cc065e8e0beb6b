// Two streams joined byte for byte: a balancer client pinned to one replica (an Upgrade, or
// anything that is not relayed request by request).

import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';

/**
 * Joins the accepted client and the upstream stream: bytes both ways with backpressure, EOF
 * passed on, and when either side closes the other is released. Cheaper than two pipe()s
 * (no unpipe bookkeeping).
 */
export function splice(client: Socket, up: Duplex): void {
  const forward = (from: Duplex, to: Duplex): void => {
    from.on('data', (chunk: Buffer) => {
      if (to.writableEnded || to.destroyed) return; // the other side is gone: drop
      if (to.write(chunk)) return;
      from.pause();
      to.once('drain', () => from.resume());
    });
    from.once('end', () => {
      if (!to.writableEnded) to.end();
    });
  };
  forward(client, up);
  forward(up, client);
  up.on('error', () => up.destroy());
  up.once('close', () => {
    if (!client.writableEnded) client.destroy(); // else let the ended client flush
  });
  client.once('close', () => {
    // ssh2 emits a channel's 'close' only after its 'end': drain what is left unread.
    up.resume();
    up.destroy();
  });
}
