// Opening a chain of ssh2 clients: hop 0 over TCP, every further hop over a `forwardOut`
// channel of the previous one. Failures come back as SshConnectError with the condition
// reason they map to; messages never contain key material.

import type { Duplex } from 'node:stream';
import { Client, type Algorithms, type ClientChannel } from 'ssh2';
import type { HostKeyBook } from './host-keys.js';
import type { HopTarget } from './targets.js';

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
  hostKeys: HostKeyBook;
  /** Per hop: TCP connect + handshake + auth. */
  connectTimeoutMs: number;
  keepaliveIntervalMs: number;
  keepaliveCountMax: number;
  algorithms?: Algorithms;
}

/** The path naming hop `i` for host-key bookkeeping. */
export function endpointOf(hops: readonly HopTarget[], i: number): string {
  return hops.slice(0, i + 1).map((h) => `${h.host}:${h.port}`).join('>');
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
          sock = await forwardOut(clients[i - 1]!, hop.host, hop.port, o.connectTimeoutMs);
        } catch (err) {
          throw new SshConnectError('ConnectFailed', `${hopName(hop)} via ${endpointOf(hops, i - 1)}: ${safeMessage(err)}`);
        }
      }
      clients.push(await connectHop(hop, sock, endpointOf(hops, i), o));
    }
    return clients;
  } catch (err) {
    for (const c of clients.reverse()) c.end();
    throw err;
  }
}

function connectHop(hop: HopTarget, sock: Duplex | undefined, endpoint: string, o: ChainOptions): Promise<Client> {
  return new Promise((resolve, reject) => {
    const client = new Client();
    let mismatch: string | null = null;
    let settled = false;
    const fail = (err: unknown): void => {
      if (settled) return;
      settled = true;
      client.end();
      sock?.destroy();
      const msg = `${hopName(hop)}: ${safeMessage(err)}`;
      if (mismatch !== null) reject(new SshConnectError('HostKeyMismatch', `${hopName(hop)}: ${mismatch}`));
      else if (levelOf(err) === 'client-authentication') reject(new SshConnectError('AuthFailed', `${hopName(hop)}: authentication failed (publickey)`));
      else reject(new SshConnectError('ConnectFailed', msg));
    };
    client.once('ready', () => {
      if (settled) return;
      settled = true;
      client.removeListener('error', fail);
      client.on('error', () => undefined); // later errors surface as 'close' to the owner
      client.setNoDelay(true);
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
          const verdict = o.hostKeys.check(endpoint, key, hop.hostKeyFingerprint);
          if (verdict.ok) return true;
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

/** Opens a direct-tcpip channel to host:port; rejects after timeoutMs (and closes a late one). */
export function forwardOut(client: Client, host: string, port: number, timeoutMs: number): Promise<ClientChannel> {
  return new Promise((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new Error(`channel to ${host}:${port} did not open within ${timeoutMs} ms`));
    }, timeoutMs);
    try {
      client.forwardOut('127.0.0.1', 0, host, port, (err, stream) => {
        clearTimeout(timer);
        if (done) {
          stream?.close();
          return;
        }
        done = true;
        if (err) reject(err);
        else resolve(stream);
      });
    } catch (err) {
      clearTimeout(timer);
      done = true;
      reject(err instanceof Error ? err : new Error(String(err)));
    }
  });
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
