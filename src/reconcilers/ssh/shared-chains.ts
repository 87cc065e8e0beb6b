// SSH connections shared by the tunnels that would open identical ones, as OpenSSH's
// ControlMaster shares a master connection. Replicas behind the same hops with the same user
// and key (services of one project on one machine, every job behind one jump host) then cost one
// handshake instead of one each: on a loopback OpenSSH sshd the handshake alone is 60–100 ms,
// and every tunnel otherwise also holds its own sshd session process. Each request still gets
// its own channel, as before.
//
// What a chain is: the hops in order, each host, port, user, private key and pinned
// fingerprint. The connect options (timeouts, keepalive, algorithms) are the loop's, the same
// for every tunnel. Host keys stay judged per tunnel: the connection is verified during its
// handshake under the scope of the tunnel that opened it, and every other tunnel that joins it
// has the keys it presented checked under its own scope (a `tofu-per-replica` replica records
// or compares its destination key as if it had connected itself).
//
// A connection lives while one tunnel holds it. When it is lost every holder hears of it and
// reconnects on its own backoff; the first of them opens the next connection and the later ones
// join it.

import { createHash } from 'node:crypto';
import type { Client } from 'ssh2';
import type { HostKeyScope } from './host-keys.js';
import { connectChain, endClient, endpointOf, safeMessage, SshConnectError, type ChainOptions } from './ssh-chain.js';
import type { HopTarget } from './targets.js';

/** A tunnel's hold on a shared connection. */
export interface ChainLease {
  /** Hop 0 first; the last one reaches the replica. */
  readonly clients: readonly Client[];
  /** Gives the hold back; the connection ends with its last holder. */
  release: () => void;
}

interface Shared {
  key: string;
  hops: readonly HopTarget[];
  clients: Client[];
  /** The host key each hop presented in this connection's handshake. */
  presented: Buffer[];
  holders: Set<(why: string) => void>;
  lost: boolean;
}

export interface ChainConnectOptions extends Omit<ChainOptions, 'hostKeyScope' | 'onHostKey'> {
  /** False: every acquire opens a connection of its own. Default true. */
  share?: boolean;
}

export class SharedChains {
  readonly #o: ChainConnectOptions;
  readonly #live = new Map<string, Shared>();
  readonly #connecting = new Map<string, { scope: HostKeyScope; done: Promise<Shared> }>();
  #unshared = 0;

  constructor(o: ChainConnectOptions) {
    this.#o = o;
  }

  /** Connections open now. */
  get size(): number {
    return this.#live.size;
  }

  /**
   * A hold on a connection along `hops`: an open one when there is one, else the one being
   * opened, else a new one. `onLost` is called once if the connection goes away while held.
   * Rejects with SshConnectError as connectChain does.
   */
  async acquire(hops: readonly HopTarget[], scope: HostKeyScope, onLost: (why: string) => void): Promise<ChainLease> {
    const key = this.#o.share === false ? `${++this.#unshared}` : chainKey(hops);
    for (;;) {
      const live = this.#live.get(key);
      if (live !== undefined) return this.#join(live, scope, onLost);
      const pending = this.#connecting.get(key);
      if (pending === undefined) return this.#join(await this.#open(key, hops, scope), scope, onLost);
      try {
        await pending.done;
      } catch (err) {
        // A host key refused under the opener's scope says nothing about ours: try our own.
        const mine = err instanceof SshConnectError && err.reason === 'HostKeyMismatch' && !sameScope(pending.scope, scope);
        if (!mine) throw err;
        if (this.#connecting.get(key) === pending) this.#connecting.delete(key);
      }
    }
  }

  #open(key: string, hops: readonly HopTarget[], scope: HostKeyScope): Promise<Shared> {
    const presented: Buffer[] = [];
    const done = connectChain(hops, { ...this.#o, hostKeyScope: scope, onHostKey: (i, blob) => (presented[i] = blob) })
      .then((clients): Shared => {
        const s: Shared = { key, hops, clients, presented, holders: new Set(), lost: false };
        const lose = (why: string): void => this.#lose(s, why);
        for (const c of clients) c.once('close', () => lose('connection closed'));
        // A hop behind a jump host whose sshd went away ends (the jump host half-closes the
        // channel) without closing: ssh2 stops its keepalive then, so nothing else would notice.
        for (const c of clients) c.once('end', () => lose('connection ended'));
        for (const c of clients) c.on('error', (err) => lose(safeMessage(err)));
        this.#live.set(key, s);
        return s;
      })
      .finally(() => {
        if (this.#connecting.get(key)?.done === done) this.#connecting.delete(key);
      });
    this.#connecting.set(key, { scope, done });
    return done;
  }

  #join(s: Shared, scope: HostKeyScope, onLost: (why: string) => void): ChainLease {
    for (let i = 0; i < s.hops.length; i++) {
      const hop = s.hops[i]!;
      const blob = s.presented[i];
      if (blob === undefined) continue;
      const verdict = this.#o.hostKeys.check(
        { endpoint: endpointOf(s.hops, i), destination: i === s.hops.length - 1 },
        blob,
        hop.hostKeyFingerprint,
        scope,
      );
      if (!verdict.ok) throw new SshConnectError('HostKeyMismatch', `${hop.user}@${hop.host}:${hop.port}: ${verdict.message}`);
    }
    s.holders.add(onLost);
    let held = true;
    return {
      clients: s.clients,
      release: () => {
        if (!held) return;
        held = false;
        s.holders.delete(onLost);
        if (s.holders.size === 0) this.#end(s);
      },
    };
  }

  #lose(s: Shared, why: string): void {
    if (s.lost) return;
    const holders = [...s.holders];
    s.holders.clear();
    this.#end(s);
    for (const h of holders) h(why);
  }

  #end(s: Shared): void {
    s.lost = true;
    if (this.#live.get(s.key) === s) this.#live.delete(s.key);
    for (const c of [...s.clients].reverse()) endClient(c, this.#o.clock);
  }
}

/** Everything that makes two connections interchangeable; the key is hashed, never kept. */
function chainKey(hops: readonly HopTarget[]): string {
  const h = createHash('sha256');
  for (const hop of hops) {
    h.update(`${hop.host}\0${hop.port}\0${hop.user}\0${hop.hostKeyFingerprint ?? ''}\0`);
    h.update(hop.privateKey);
    h.update('\0\0');
  }
  return h.digest('base64');
}

function sameScope(a: HostKeyScope, b: HostKeyScope): boolean {
  return a.policy === b.policy && (a.policy === 'tofu' || a.replicaId === b.replicaId);
}
