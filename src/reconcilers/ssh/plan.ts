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
  /** Read timeouts (ms) of the services that have their own, as the data plane has them. */
  readTimeouts?: ReadonlyMap<string, number>;
  /** By-host routes (service → host), as the data plane has them. */
  hosts?: ReadonlyMap<string, string>;
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
  /** Read timeouts (ms) of the services that set one (`readTimeout`). */
  readTimeouts?: ReadonlyMap<string, number>;
  /** The services our default server may send to by their Host (service → host). */
  hosts?: ReadonlyMap<string, string>;
  /**
   * Every service's domain in lower case. With it, a removed service's requests (from a site
   * Nginx still has) are answered as an unknown host's at once, unless a service here claims
   * their host (Replicas.setLeft).
   */
  domains?: ReadonlySet<string>;
}

export type SshPayload =
  /** `claimed` (a removal): the hosts the document still has, see SshDesired.domains. */
  | { what: 'service'; serviceKey: string; claimed?: ReadonlySet<string> }
  | { what: 'close' | 'restore'; serviceKey: string }
  | { what: 'replica'; replica: DesiredReplica | null; previous: { serviceKey: string } | null }
  /** A service's own read timeout in the data plane; null: back to the default. */
  | { what: 'options'; serviceKey: string; readTimeoutMs: number | null }
  /** A service's by-host route; null: none. */
  | { what: 'host'; serviceKey: string; host: string | null };

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
        payload: { what: 'service', serviceKey: sk, ...(desired.domains ? { claimed: desired.domains } : {}) },
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
  planReadTimeouts(desired, observed, actions);
  planHosts(desired, observed, actions);
  return actions;
}

/**
 * By-host routes: set where the document's differ from the data plane's, removed at once for a
 * service that has none (gone, or no longer one our default server may serve): a request for a
 * removed service's host then gets the unknown host's 404, as it would once its site is gone.
 */
function planHosts(desired: SshDesired, observed: ObservedSsh, actions: Action<SshPayload>[]): void {
  const want = desired.hosts ?? NO_HOSTS;
  const have = observed.hosts ?? NO_HOSTS;
  if (want === have) return;
  for (const [sk, host] of want) {
    const cur = have.get(sk);
    if (cur === host) continue;
    actions.push({
      key: `host:${sk}`,
      kind: cur === undefined ? 'create' : 'update',
      summary: `route requests for ${host} without a site of their own to ${sk}`,
      payload: { what: 'host', serviceKey: sk, host },
    });
  }
  for (const [sk, host] of have) {
    if (want.has(sk)) continue;
    actions.push({
      key: `host:${sk}`,
      kind: 'delete',
      summary: `no route by host ${host} to ${sk}`,
      payload: { what: 'host', serviceKey: sk, host: null },
    });
  }
}

const NO_HOSTS: ReadonlyMap<string, string> = new Map();

const NONE: ReadonlyMap<string, number> = new Map();

/**
 * Per-service read timeouts: set where the document's differ from the data plane's; back to the
 * default where the document has none, once the service is not even retiring (its requests
 * still finishing keep theirs).
 */
function planReadTimeouts(desired: SshDesired, observed: ObservedSsh, actions: Action<SshPayload>[]): void {
  const want = desired.readTimeouts ?? NONE;
  const have = observed.readTimeouts ?? NONE;
  for (const [sk, ms] of want) {
    if (have.get(sk) === ms) continue;
    actions.push({
      key: `options:${sk}`,
      kind: have.has(sk) ? 'update' : 'create',
      summary: `read timeout of ${sk}: ${ms / 1000} s`,
      payload: { what: 'options', serviceKey: sk, readTimeoutMs: ms },
    });
  }
  for (const sk of have.keys()) {
    if (want.has(sk) || (!desired.services.has(sk) && observed.services.has(sk))) continue;
    actions.push({
      key: `options:${sk}`,
      kind: 'delete',
      summary: `read timeout of ${sk}: the default`,
      payload: { what: 'options', serviceKey: sk, readTimeoutMs: null },
    });
  }
}
