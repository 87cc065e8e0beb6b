// Opening a chain of ssh2 clients: hop 0 over TCP, every further hop over a `forwardOut`
// channel of the previous one. Failures come back as SshConnectError with the condition
// reason they map to; messages never contain key material.

import { connect as netConnect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Algorithms, Client as Ssh2Client, ClientChannel } from 'ssh2';
import type { Clock } from '../../clock.js';
import type { HopOnPath, HostKeyBook, HostKeyScope } from './host-keys.js';
import { ackPromptly } from './prompt-ack.js';
import { Client, ignoreSender } from '../../ssh2.js';
import type { HopTarget } from './targets.js';

type Client = Ssh2Client;

export type ConnectReason = 'ConnectFailed' | 'AuthFailed' | 'HostKeyMismatch';

export class SshConnectError extends Error {
  readonly reason: ConnectReason;
  constructor(reason: ConnectReason, message: string) {
    super(message);
    this.name = 'SshConnectError';
    this.reason = reason;
  }
}

export interface ChainOptions {
  /** Channel-open timeouts and the prompt ACKs run on it (ssh2's own handshake and keepalive timers do not). */
  clock: Clock;
  hostKeys: HostKeyBook;
  /** The replica's host-key policy and id; absent: `tofu`. */
  hostKeyScope?: HostKeyScope;
  /** Per hop: TCP connect + handshake + auth. */
  connectTimeoutMs: number;
  keepaliveIntervalMs: number;
  keepaliveCountMax: number;
  algorithms?: Algorithms;
  /** Told the host key hop `i` presented once it is accepted. */
  onHostKey?: (i: number, keyBlob: Buffer) => void;
}

/** The path naming hop `i` for host-key bookkeeping. */
export function endpointOf(hops: readonly HopTarget[], i: number): string {
  return hops
    .slice(0, i + 1)
    .map((h) => `${h.host}:${h.port}`)
    .join('>');
}

/** Connects every hop in order; on failure closes what was opened and throws SshConnectError. */
export async function connectChain(hops: readonly HopTarget[], o: ChainOptions): Promise<Client[]> {
  const clients: Client[] = [];
  try {
    for (let i = 0; i < hops.length; i++) {
      const hop = hops[i]!;
      let sock: Duplex | undefined;
      if (i > 0) {
        try {
          sock = await forwardOut(clients[i - 1]!, hop.host, hop.port, o.connectTimeoutMs, o.clock);
        } catch (err) {
          throw new SshConnectError('ConnectFailed', `${hopName(hop)} via ${endpointOf(hops, i - 1)}: ${safeMessage(err)}`);
        }
      }
      const path = { endpoint: endpointOf(hops, i), destination: i === hops.length - 1 };
      clients.push(await connectHop(hop, sock, path, o, (blob) => o.onHostKey?.(i, blob)));
    }
    return clients;
  } catch (err) {
    for (const c of clients.reverse()) c.end();
    throw err;
  }
}

function connectHop(
  hop: HopTarget,
  sock: Duplex | undefined,
  path: HopOnPath,
  o: ChainOptions,
  accepted: (keyBlob: Buffer) => void,
): Promise<Client> {
  return new Promise((resolve, reject) => {
    const client = new Client();
    // Hop 0: our own TCP socket, so that its writes can be coalesced (see coalesceWrites).
    if (!sock) sock = coalesceWrites(netConnect({ host: hop.host, port: hop.port, noDelay: true }));
    const transport = sock;
    let mismatch: string | null = null;
    let settled = false;
    const fail = (err: unknown): void => {
      if (settled) return;
      settled = true;
      client.end();
      sock?.destroy();
      const msg = `${hopName(hop)}: ${safeMessage(err)}`;
      if (mismatch !== null) reject(new SshConnectError('HostKeyMismatch', `${hopName(hop)}: ${mismatch}`));
      else if (levelOf(err) === 'client-authentication')
        reject(new SshConnectError('AuthFailed', `${hopName(hop)}: authentication failed (publickey)`));
      else reject(new SshConnectError('ConnectFailed', msg));
    };
    client.once('ready', () => {
      if (settled) return;
      settled = true;
      client.removeListener('error', fail);
      client.on('error', () => undefined); // later errors surface as 'close' to the owner
      client.setNoDelay(true);
      // Every hop: each sshd's socket (to us, or to the previous sshd) runs Nagle.
      const nudge = ignoreSender(client);
      if (nudge !== null) ackPromptly(transport, nudge, { clock: o.clock });
      resolve(client);
    });
    client.on('error', fail);
    client.once('close', () => fail(new Error('connection closed during handshake')));
    try {
      client.connect({
        host: hop.host,
        port: hop.port,
        username: hop.user,
        privateKey: hop.privateKey,
        ...(sock ? { sock } : {}),
        readyTimeout: o.connectTimeoutMs,
        keepaliveInterval: o.keepaliveIntervalMs,
        keepaliveCountMax: o.keepaliveCountMax,
        ...(o.algorithms ? { algorithms: o.algorithms } : {}),
        hostVerifier: (key: Buffer): boolean => {
          const verdict = o.hostKeys.check(path, key, hop.hostKeyFingerprint, o.hostKeyScope);
          if (verdict.ok) {
            accepted(key);
            return true;
          }
          mismatch = verdict.message;
          return false;
        },
      });
    } catch (err) {
      // ssh2 throws synchronously on an unparsable key; its message names the format, not the key.
      fail(new Error(`cannot use the private key: ${safeMessage(err)}`));
    }
  });
}

/**
 * ssh2 writes every SSH packet to its socket with its own write(): one syscall per packet, and
 * on loopback TCP each costs as much as the tunnelling itself. Corking the socket at the first
 * write of an event-loop turn and uncorking once the turn's I/O callbacks have run
 * (setImmediate) sends every packet of that turn — channel opens, data of several channels,
 * EOF + CLOSE — in one writev, the way OpenSSH flushes its output buffer once per poll loop.
 */
export function coalesceWrites(sock: Socket): Socket {
  let corked = false;
  const flush = (): void => {
    corked = false;
    sock.uncork();
  };
  const write = sock.write.bind(sock) as (chunk: Buffer) => boolean;
  sock.write = ((chunk: Buffer): boolean => {
    if (!corked) {
      corked = true;
      sock.cork();
      setImmediate(flush);
    }
    return write(chunk);
  }) as Socket['write'];
  return sock;
}

/** A polite disconnect, then the socket is destroyed in case the peer no longer answers. */
export function endClient(c: Client, clock: Clock): void {
  c.end();
  clock.setTimeout(() => c.destroy(), END_GRACE_MS);
}

/** How long a peer gets to answer our disconnect before the socket is destroyed. */
export const END_GRACE_MS = 1_000;

/** Opens a direct-tcpip channel to host:port; rejects after timeoutMs (and closes a late one). */
export function forwardOut(client: Client, host: string, port: number, timeoutMs: number, clock: Clock): Promise<ClientChannel> {
  return new Promise((resolve, reject) => {
    let done = false;
    const timer = clock.setTimeout(() => {
      done = true;
      reject(new Error(`channel to ${host}:${port} did not open within ${timeoutMs} ms`));
    }, timeoutMs);
    try {
      client.forwardOut('127.0.0.1', 0, host, port, (err, stream) => {
        clock.clearTimeout(timer);
        if (done) {
          stream?.close();
          return;
        }
        done = true;
        if (err) reject(err);
        else resolve(quietDestroy(stream));
      });
    } catch (err) {
      clock.clearTimeout(timer);
      done = true;
      reject(err instanceof Error ? err : new Error(String(err)));
    }
  });
}

/**
 * ssh2's Channel.destroy() is end() + close(), and Node's stream auto-destroy calls it once
 * both sides are done: end() on a finished stream then builds an ERR_STREAM_ALREADY_FINISHED
 * with a stack trace, per connection, for nobody. Same behaviour without the extra end().
 */
function quietDestroy(ch: ClientChannel): ClientChannel {
  ch.destroy = function destroy(this: ClientChannel): ClientChannel {
    if (!this.writableEnded) this.end();
    this.close();
    return this;
  };
  return ch;
}

function hopName(h: HopTarget): string {
  return `${h.user}@${h.host}:${h.port}`;
}

function levelOf(err: unknown): string | undefined {
  return typeof err === 'object' && err !== null && 'level' in err ? String((err as { level: unknown }).level) : undefined;
}

/** An error's message with anything that looks like key material cut off. */
export function safeMessage(err: unknown): string {
  const m = err instanceof Error ? err.message : String(err);
  const cut = m.search(/-----BEGIN|PRIVATE KEY/);
  return (cut === -1 ? m : `${m.slice(0, cut)}[redacted]`).slice(0, 300);
}
