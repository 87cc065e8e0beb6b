// The SSH loop's plan (pure): what it holds against what the document asks for. Sockets and
// replicas are compared by fingerprint, so an unchanged replica is never touched; a removed
// service retires (keeps serving) until nothing routes to it or its drain period is over.

import type { Action } from '../types.js';
import { describeTarget, type DesiredReplica, type DesiredSsh } from './targets.js';

export interface ObservedSsh {
  /** Listening sockets, retiring ones included. */
  services: Set<string>;
  /** Held replicas, except those of retiring services (they close with their service). */
  replicas: Map<string, { serviceKey: string; fingerprint: string }>;
  /** Services removed from the spec whose socket still serves until nothing routes to it. */
  retiring?: ReadonlyMap<string, Retiring>;
  now?: number;
}

export interface Retiring {
  /** The generation the service was first missing from. */
  since: number;
  /** When it was retired (epoch ms). */
  at: number;
  /** When the router was first seen past `since`. */
  caughtUpAt: number | null;
  /** Its replicas, kept in rotation until the socket closes. */
  replicas: Set<string>;
}

export interface SshDesired extends DesiredSsh {
  generation: number;
  /** The newest generation the router has served in full (Ready); Infinity without a router. */
  routedUpTo: number;
}

export type SshPayload =
  | { what: 'service'; serviceKey: string }
  | { what: 'close' | 'restore'; serviceKey: string }
  | { what: 'replica'; replica: DesiredReplica | null; previous: { serviceKey: string } | null };

/**
 * The actions that close the gap: per service socket create/restore/delete/close, per
 * replica create/update/delete. `drainMs` bounds how long a retired service keeps its socket.
 */
export function planSsh(desired: SshDesired, observed: ObservedSsh, drainMs: number): Action<SshPayload>[] {
  const actions: Action<SshPayload>[] = [];
  const gone = observed.retiring ?? new Map<string, Retiring>();
  for (const sk of desired.services) {
    if (gone.has(sk))
      actions.push({
        key: `service:${sk}`,
        kind: 'restore',
        summary: `keep the socket of ${sk} (back in the document)`,
        payload: { what: 'restore', serviceKey: sk },
      });
    else if (!observed.services.has(sk))
      actions.push({
        key: `service:${sk}`,
        kind: 'create',
        summary: `listen on the socket of ${sk}`,
        payload: { what: 'service', serviceKey: sk },
      });
  }
  for (const sk of observed.services) {
    if (desired.services.has(sk)) continue;
    const r = gone.get(sk);
    if (!r)
      actions.push({
        key: `service:${sk}`,
        kind: 'delete',
        summary: `close the socket of ${sk}`,
        payload: { what: 'service', serviceKey: sk },
      });
    else if (desired.routedUpTo >= r.since || (observed.now ?? 0) - r.at >= drainMs) {
      actions.push({
        key: `service:${sk}`,
        kind: 'close',
        summary: `close the socket of ${sk}: nothing routes to it any more`,
        payload: { what: 'close', serviceKey: sk },
      });
    }
  }
  for (const [id, d] of desired.replicas) {
    const cur = observed.replicas.get(id);
    if (cur?.fingerprint === d.fingerprint) continue;
    const kind = cur ? 'update' : 'create';
    actions.push({
      key: `replica:${id}`,
      kind,
      summary: `${kind === 'create' ? 'open' : 'reopen'} the tunnel of replica ${id} of ${d.serviceKey} (${describeTarget(d.target)})`,
      payload: { what: 'replica', replica: d, previous: cur ? { serviceKey: cur.serviceKey } : null },
    });
  }
  for (const [id, cur] of observed.replicas) {
    if (desired.replicas.has(id)) continue;
    actions.push({
      key: `replica:${id}`,
      kind: 'delete',
      summary: `close the tunnel of replica ${id} of ${cur.serviceKey}`,
      payload: { what: 'replica', replica: null, previous: { serviceKey: cur.serviceKey } },
    });
  }
  return actions;
}
