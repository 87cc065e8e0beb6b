// ssh2, loaded so that its per-packet random padding comes from a pooled CSPRNG buffer.
//
// ssh2 pads every packet with 4–19 random bytes through crypto.randomFillSync, which it binds
// when its modules load. Each call sets up an OpenSSL job and takes the DRBG lock: measured
// (perf, 16 connections through nginx) at ~10 % of the tunnel process's CPU, three times its
// AES-GCM encryption. The same CSPRNG filling 16 KiB at a time and handing out each byte once
// gives padding of the same quality. The swap of crypto.randomFillSync lasts only for the
// synchronous require() below; nothing else in the process ever sees it. If ssh2 was already
// loaded by someone else, require() returns that copy and padding stays as ssh2 does it.

import crypto from 'node:crypto';
import { createRequire } from 'node:module';
import type * as Ssh2 from 'ssh2';

const POOL_BYTES = 16 * 1024;
/** Larger requests go to the CSPRNG directly. */
const MAX_POOLED = 256;

export function pooledRandomFill(fill: typeof crypto.randomFillSync): typeof crypto.randomFillSync {
  let pool = Buffer.alloc(0);
  let pos = 0;
  return (<T extends NodeJS.ArrayBufferView>(buf: T, offset?: number, size?: number): T => {
    if (!Buffer.isBuffer(buf)) return fill(buf, offset, size);
    const start = offset ?? 0;
    const n = size ?? buf.length - start;
    if (n > MAX_POOLED || n < 0 || start < 0 || start + n > buf.length) return fill(buf, offset, size);
    if (pos + n > pool.length) {
      pool = fill(Buffer.allocUnsafe(POOL_BYTES));
      pos = 0;
    }
    pool.copy(buf, start, pos, pos + n);
    pool.fill(0, pos, pos + n); // used bytes do not linger
    pos += n;
    return buf;
  }) as typeof crypto.randomFillSync;
}

function loadSsh2(): typeof Ssh2 {
  const original = crypto.randomFillSync;
  crypto.randomFillSync = pooledRandomFill(original);
  try {
    return createRequire(import.meta.url)('ssh2') as typeof Ssh2;
  } finally {
    crypto.randomFillSync = original;
  }
}

const ssh2 = loadSsh2();
export const Client: typeof Ssh2.Client = ssh2.Client;

/** ssh2's packet writer and its send function: ssh2 has no public call for SSH_MSG_IGNORE. */
interface PacketProtocol {
  _packetRW: { write: { allocStart: number; alloc(n: number): Buffer; finalize(packet: Buffer): Buffer } };
}
const utils = createRequire(import.meta.url)('ssh2/lib/protocol/utils.js') as {
  sendPacket?: (proto: PacketProtocol, packet: Buffer) => boolean;
};
const MSG_IGNORE = 2;

/**
 * A sender of SSH_MSG_IGNORE (empty data) on the client's connection, or null when this ssh2
 * does not have the internals it needs (then callers do without). Built the way ssh2 builds
 * its own packets, so it is encrypted, sequenced and held back during a key exchange like them.
 */
export function ignoreSender(client: Ssh2.Client): (() => void) | null {
  const proto = (client as unknown as { _protocol?: Partial<PacketProtocol> })._protocol;
  const send = utils.sendPacket;
  if (typeof proto?._packetRW?.write?.alloc !== 'function' || typeof send !== 'function') return null;
  const p = proto as PacketProtocol;
  return () => {
    const writer = p._packetRW.write; // replaced after a key exchange that turns compression on
    const start = writer.allocStart;
    const packet = writer.alloc(1 + 4);
    packet[start] = MSG_IGNORE;
    packet.writeUInt32BE(0, start + 1); // string data: empty
    send(p, writer.finalize(packet));
  };
}

/** ssh2's key parser, from the copy loaded above (requiring it apart would load ssh2 unpooled). */
export const parseKey: typeof Ssh2.utils.parseKey = ssh2.utils.parseKey;
