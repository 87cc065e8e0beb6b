// Host key checks: a pinned SHA256 fingerprint per hop when the document gives one, else trust
// on first use. A hop is named by the whole path that reaches it (`a:22>b:22`), because
// 127.0.0.1:22 seen from a jump host is another machine.
//
// Two policies of trust on first use (the replica's `hostKeyPolicy`):
// - `tofu`: the first key a path presents is trusted for the lifetime of the process, whichever
//   replica reaches it.
// - `tofu-per-replica`: the destination hop's key is trusted per replica id, so a new replica
//   behind a reused host and port may present a new key (a job container with fresh host keys)
//   while a key that changes under the same replica id is refused. The hops before it (jump
//   hosts, head proxies: the VM that runs the containers) keep their key across jobs, so their
//   first key is shared by every replica reaching them through that path and a change is refused
//   for new replicas too; it is forgotten once no replica that trusted it is left (the VM was
//   replaced behind a reused address only after its jobs were gone). A new key there can
//   therefore only come with a new machine, never in the middle of a network path that is in use.
// The two policies keep separate books: neither judges the other's replicas.

import { createHash } from 'node:crypto';
import type { HostKeyPolicy } from '../../spec/types.js';

/** `SHA256:<base64 without padding>`, as `ssh-keygen -lf` prints it. */
export function sha256Fingerprint(keyBlob: Buffer): string {
  return `SHA256:${createHash('sha256').update(keyBlob).digest('base64').replace(/=+$/, '')}`;
}

export type HostKeyVerdict = { ok: true } | { ok: false; message: string };

/** Whose trust a check uses: absent or `tofu`, the process-wide book. */
export interface HostKeyScope {
  policy: HostKeyPolicy;
  replicaId: string;
}

/** The hop being checked: its path, and whether it is the last one (the replica itself). */
export interface HopOnPath {
  endpoint: string;
  destination: boolean;
}

export class HostKeyBook {
  /** `tofu`: path → fingerprint, for the lifetime of the process. */
  readonly #seen = new Map<string, string>();
  /** `tofu-per-replica` destinations: replica id → path → fingerprint. */
  readonly #perReplica = new Map<string, Map<string, string>>();
  /** `tofu-per-replica` hops before the destination: path → fingerprint and the replicas that trusted it. */
  readonly #shared = new Map<string, { fingerprint: string; holders: Set<string> }>();

  /** Checks (and on first use records) the key the hop presented; a bare path is a destination. */
  check(hop: HopOnPath | string, keyBlob: Buffer, pinned?: string, scope?: HostKeyScope): HostKeyVerdict {
    const { endpoint, destination } = typeof hop === 'string' ? { endpoint: hop, destination: true } : hop;
    const got = sha256Fingerprint(keyBlob);
    if (pinned !== undefined) {
      if (pinned.replace(/=+$/, '') === got) return { ok: true };
      return { ok: false, message: `host key of ${endpoint} is ${got}, the document pins ${pinned}` };
    }
    if (scope === undefined || scope.policy === 'tofu') return trust(this.#seen, endpoint, got, '');
    if (destination) {
      let mine = this.#perReplica.get(scope.replicaId);
      if (mine === undefined) this.#perReplica.set(scope.replicaId, (mine = new Map()));
      return trust(mine, endpoint, got, ` for replica ${scope.replicaId}`);
    }
    const entry = this.#shared.get(endpoint);
    if (entry === undefined) {
      this.#shared.set(endpoint, { fingerprint: got, holders: new Set([scope.replicaId]) });
      return { ok: true };
    }
    if (entry.fingerprint !== got) return changed(endpoint, entry.fingerprint, got, ' while replicas that trusted it are in the document');
    entry.holders.add(scope.replicaId);
    return { ok: true };
  }

  /** Forgets the `tofu-per-replica` trust of every replica not in `keep` (they left the document). */
  retain(keep: { has(id: string): boolean }): void {
    for (const id of this.#perReplica.keys()) if (!keep.has(id)) this.#perReplica.delete(id);
    for (const [path, entry] of this.#shared) {
      for (const id of entry.holders) if (!keep.has(id)) entry.holders.delete(id);
      if (entry.holders.size === 0) this.#shared.delete(path);
    }
  }

  /** The fingerprint trusted for `endpoint` (under `scope`, a destination), if any. */
  get(endpoint: string, scope?: HostKeyScope, destination = true): string | undefined {
    if (scope === undefined || scope.policy === 'tofu') return this.#seen.get(endpoint);
    if (destination) return this.#perReplica.get(scope.replicaId)?.get(endpoint);
    return this.#shared.get(endpoint)?.fingerprint;
  }

  /** Entries held: what retain() keeps bounded. */
  get size(): { tofu: number; perReplica: number; shared: number } {
    let perReplica = 0;
    for (const m of this.#perReplica.values()) perReplica += m.size;
    return { tofu: this.#seen.size, perReplica, shared: this.#shared.size };
  }
}

function trust(book: Map<string, string>, endpoint: string, got: string, whose: string): HostKeyVerdict {
  const known = book.get(endpoint);
  if (known === undefined) {
    book.set(endpoint, got);
    return { ok: true };
  }
  return known === got ? { ok: true } : changed(endpoint, known, got, whose);
}

function changed(endpoint: string, known: string, got: string, why: string): HostKeyVerdict {
  return { ok: false, message: `host key of ${endpoint} changed from ${known} to ${got}${why}; refusing to connect` };
}
