// The SSH loop's plan (pure): what it holds against what the document asks for. Sockets and
// replicas are compared by fingerprint, so an unchanged replica is never touched; a removed
// service retires (keeps serving) until nothing routes to it or its drain period is over.
//
// The plan walks the document a service at a time. With the loop's per-service versions of what
// it holds and a memo of the services found converged, a service whose entry and version are
// those of a pass that found nothing to do is not compared again: after a one-service change,
// a pass compares that service and walks the others' pointers. What spans services (a removed
// service, a replica that moved, an option or route left behind) is found by counting what the
// walk matched, and looked for only when the counts say something is left over.

import { sameRoute, type HostRoute } from '../../dataplane/service-header.js';
import type { Action } from '../types.js';
import { describeTarget, type DesiredReplica, type ServiceDesired } from './targets.js';

/** A set of keys as a Set or a Map's keys hold it, without a copy. */
export interface KeySet {
  has(key: string): boolean;
  readonly size: number;
  keys(): Iterable<string>;
}

/** A replica as held: under which service, with which connection. */
export interface HeldReplica {
  serviceKey: string;
  fingerprint: string;
}

export interface ObservedSsh {
  /** Listening sockets, retiring ones included. */
  services: KeySet;
  /** Held replicas, except those of retiring services (they close with their service). */
  replicas: ReadonlyMap<string, HeldReplica>;
  /** Services removed from the spec whose socket still serves until nothing routes to it. */
  retiring?: ReadonlyMap<string, Retiring>;
  now?: number;
  /** Read timeouts (ms) of the services that have their own, as the data plane has them. */
  readTimeouts?: ReadonlyMap<string, number>;
  /** By-host routes by service, as the data plane has them. */
  hosts?: ReadonlyMap<string, HostRoute>;
  /** The ids of `replicas` by service; derived from `replicas` when absent. */
  replicasByService?: ReadonlyMap<string, ReadonlySet<string>>;
  /**
   * Per service, its facts as above, a new object whenever any of them changes. With it,
   * planSsh's `converged` memo lets a pass skip a service it already found converged.
   */
  facts?: ReadonlyMap<string, ServiceFacts>;
}

/** What `ObservedSsh` says about one service, counted; its identity versions them. */
export interface ServiceFacts {
  readonly listening: boolean;
  /** Its replicas in `replicas`. */
  readonly held: number;
  readonly readTimeout: boolean;
  readonly hostRoute: boolean;
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

export interface SshDesired {
  /** Per service, in the spec's order. */
  services: readonly ServiceDesired[];
  generation: number;
  /** The newest generation the router has served in full (Ready); Infinity without a router. */
  routedUpTo: number;
  /** Whether by-host routes are planned (the services our default server may send to by Host). */
  hostRoutes?: boolean;
  /**
   * Every service's domain in lower case, asked for only when a service is removed: its
   * requests (from a site Nginx still has) are then answered as an unknown host's at once,
   * unless a service here claims their host (Replicas.setLeft). Absent: no claims.
   */
  domains?: () => ReadonlySet<string>;
}

export type SshPayload =
  /** `claimed` (a removal): the hosts the document still has, see SshDesired.domains. */
  | { what: 'service'; serviceKey: string; claimed?: ReadonlySet<string> }
  | { what: 'close' | 'restore'; serviceKey: string }
  | { what: 'replica'; replica: DesiredReplica | null; previous: { serviceKey: string } | null }
  /** A service's own read timeout in the data plane; null: back to the default. */
  | { what: 'options'; serviceKey: string; readTimeoutMs: number | null }
  /** A service's by-host route; null: none. */
  | { what: 'host'; serviceKey: string; route: HostRoute | null };

/**
 * Services found converged, by their entry: the version of what was held then. The loop keeps
 * one across passes; an entry that is no longer referenced goes with its service object.
 */
export type ConvergedServices = WeakMap<ServiceDesired, ServiceFacts>;

const NO_RETIRING: ReadonlyMap<string, Retiring> = new Map();
const NO_NUMBERS: ReadonlyMap<string, number> = new Map();
const NO_HOSTS: ReadonlyMap<string, HostRoute> = new Map();

/**
 * The actions that close the gap: per service socket create/restore/delete/close, per
 * replica create/update/delete, per service read timeout and by-host route. `drainMs` bounds
 * how long a retired service keeps its socket.
 */
export function planSsh(desired: SshDesired, observed: ObservedSsh, drainMs: number, converged?: ConvergedServices): Action<SshPayload>[] {
  const gone = observed.retiring ?? NO_RETIRING;
  const haveTimeouts = observed.readTimeouts ?? NO_NUMBERS;
  const haveHosts = observed.hosts ?? NO_HOSTS;
  const heldBy = observed.replicasByService ?? groupByService(observed.replicas);
  const sockets: Action<SshPayload>[] = [];
  const tunnels: Action<SshPayload>[] = [];
  const leaving: Action<SshPayload>[] = [];
  const options: Action<SshPayload>[] = [];
  const routes: Action<SshPayload>[] = [];
  /** Held replicas of a compared service that its entry no longer has: leaving, or moved. */
  const unclaimed: [string, HeldReplica][] = [];
  // What the walk matched, to tell whether anything held is left over.
  let listening = 0;
  let heldMatched = 0;
  let timeoutsMatched = 0;
  let routesMatched = 0;

  /** Retiring services the document has again. */
  let backAgain: Set<string> | undefined;

  for (const d of desired.services) {
    const sk = d.serviceKey;
    const facts = observed.facts?.get(sk);
    if (facts !== undefined && converged !== undefined && converged.get(d) === facts) {
      // Converged then, and nothing about it changed since: counted, not compared.
      listening++;
      heldMatched += facts.held;
      if (facts.readTimeout) timeoutsMatched++;
      if (facts.hostRoute) routesMatched++;
      continue;
    }
    const isListening = observed.services.has(sk);
    if (isListening) listening++;
    const retiring = gone.has(sk);
    if (retiring) (backAgain ??= new Set()).add(sk);
    if (retiring) sockets.push(restoreSocket(sk));
    else if (!isListening) sockets.push(createSocket(sk));
    const held = heldBy.get(sk);
    heldMatched += held?.size ?? 0;
    const timeout = haveTimeouts.get(sk);
    if (timeout !== undefined) timeoutsMatched++;
    const route = haveHosts.get(sk);
    if (route !== undefined) routesMatched++;
    const before = tunnels.length + options.length + routes.length + unclaimed.length;

    for (const r of d.replicas) {
      const cur = observed.replicas.get(r.id);
      if (cur?.fingerprint !== r.fingerprint) tunnels.push(replicaAction(r, cur));
    }
    if (held !== undefined && held.size > 0) {
      for (const id of held) {
        if (!d.replicas.some((r) => r.id === id)) unclaimed.push([id, observed.replicas.get(id)!]);
      }
    }
    const wantTimeout = d.readTimeoutMs;
    if (wantTimeout !== undefined ? timeout !== wantTimeout : timeout !== undefined)
      options.push(timeoutAction(sk, wantTimeout ?? null, timeout));
    const wantRoute = desired.hostRoutes ? d.byHost : undefined;
    if (wantRoute !== undefined ? !sameRoute(route, wantRoute) : route !== undefined)
      routes.push(routeAction(sk, wantRoute ?? null, route));

    const quiet = isListening && !retiring && before === tunnels.length + options.length + routes.length + unclaimed.length;
    if (quiet && converged !== undefined && facts !== undefined) converged.set(d, facts);
  }

  // Left over: held services, replicas, timeouts or routes that no service of the document has.
  let wanted: ReadonlySet<string> | undefined;
  const isWanted = (sk: string): boolean => (wanted ??= new Set(desired.services.map((d) => d.serviceKey))).has(sk);
  const removed = new Set<string>();
  const leftover = observed.services.size - listening;
  if (leftover > 0) {
    // Usually just the retiring services still listening: then those are the leftovers, and
    // the document's services need not be gathered to find them.
    const stillRetiring = [...gone.keys()].filter((sk) => !backAgain?.has(sk) && observed.services.has(sk));
    const candidates = stillRetiring.length === leftover ? stillRetiring : [...observed.services.keys()].filter((sk) => !isWanted(sk));
    for (const sk of candidates) {
      removed.add(sk);
      const r = gone.get(sk);
      if (!r) sockets.push(retireSocket(sk, desired.domains?.()));
      else if (desired.routedUpTo >= r.since || (observed.now ?? 0) - r.at >= drainMs) sockets.push(closeSocket(sk));
      const held = heldBy.get(sk);
      if (held === undefined) continue;
      heldMatched += held.size;
      for (const id of held) unclaimed.push([id, observed.replicas.get(id)!]);
    }
  }
  if (observed.replicas.size > heldMatched) {
    for (const [id, cur] of observed.replicas) {
      if (!isWanted(cur.serviceKey) && !removed.has(cur.serviceKey)) unclaimed.push([id, cur]);
    }
  }
  if (unclaimed.length > 0) {
    const desiredIds = new Set<string>();
    for (const d of desired.services) for (const r of d.replicas) desiredIds.add(r.id);
    for (const [id, cur] of unclaimed) if (!desiredIds.has(id)) leaving.push(replicaLeaves(id, cur));
  }
  // A removed service's own timeout stays while it retires: its requests still finishing keep it.
  if (haveTimeouts.size > timeoutsMatched) {
    for (const [sk, ms] of haveTimeouts) if (!isWanted(sk) && !observed.services.has(sk)) options.push(timeoutAction(sk, null, ms));
  }
  if (haveHosts.size > routesMatched) {
    for (const [sk, host] of haveHosts) if (!isWanted(sk)) routes.push(routeAction(sk, null, host));
  }
  return [...sockets, ...tunnels, ...leaving, ...options, ...routes];
}

/**
 * Where two plans differ (by action key, kind and summary), or null: the check that a plan which
 * skipped converged services equals one that compared every service.
 */
export function planDifference(a: readonly Action<SshPayload>[], b: readonly Action<SshPayload>[]): string | null {
  const line = (x: Action<SshPayload>): string => `${x.kind} ${x.key}: ${x.summary}`;
  const left = a.map(line).sort();
  const right = b.map(line).sort();
  const onlyA = left.filter((x) => !right.includes(x));
  const onlyB = right.filter((x) => !left.includes(x));
  if (onlyA.length === 0 && onlyB.length === 0) return null;
  return `only in the first: [${onlyA.join('; ')}]; only in the second: [${onlyB.join('; ')}]`;
}

function groupByService(replicas: ReadonlyMap<string, HeldReplica>): Map<string, Set<string>> {
  const out = new Map<string, Set<string>>();
  for (const [id, r] of replicas) {
    let ids = out.get(r.serviceKey);
    if (ids === undefined) out.set(r.serviceKey, (ids = new Set()));
    ids.add(id);
  }
  return out;
}

function createSocket(sk: string): Action<SshPayload> {
  return { key: `service:${sk}`, kind: 'create', summary: `listen on the socket of ${sk}`, payload: { what: 'service', serviceKey: sk } };
}

function restoreSocket(sk: string): Action<SshPayload> {
  return {
    key: `service:${sk}`,
    kind: 'restore',
    summary: `keep the socket of ${sk} (back in the document)`,
    payload: { what: 'restore', serviceKey: sk },
  };
}

function retireSocket(sk: string, claimed: ReadonlySet<string> | undefined): Action<SshPayload> {
  return {
    key: `service:${sk}`,
    kind: 'delete',
    summary: `close the socket of ${sk}`,
    payload: { what: 'service', serviceKey: sk, ...(claimed ? { claimed } : {}) },
  };
}

function closeSocket(sk: string): Action<SshPayload> {
  return {
    key: `service:${sk}`,
    kind: 'close',
    summary: `close the socket of ${sk}: nothing routes to it any more`,
    payload: { what: 'close', serviceKey: sk },
  };
}

function replicaAction(d: DesiredReplica, cur: HeldReplica | undefined): Action<SshPayload> {
  const kind = cur ? 'update' : 'create';
  return {
    key: `replica:${d.id}`,
    kind,
    summary: `${kind === 'create' ? 'open' : 'reopen'} the tunnel of replica ${d.id} of ${d.serviceKey} (${describeTarget(d.target)})`,
    payload: { what: 'replica', replica: d, previous: cur ? { serviceKey: cur.serviceKey } : null },
  };
}

function replicaLeaves(id: string, cur: HeldReplica): Action<SshPayload> {
  return {
    key: `replica:${id}`,
    kind: 'delete',
    summary: `close the tunnel of replica ${id} of ${cur.serviceKey}`,
    payload: { what: 'replica', replica: null, previous: { serviceKey: cur.serviceKey } },
  };
}

/**
 * A service's read timeout: set where the document's differs from the data plane's, back to
 * the default (null) where the document has none.
 */
function timeoutAction(sk: string, ms: number | null, have: number | undefined): Action<SshPayload> {
  if (ms === null)
    return {
      key: `options:${sk}`,
      kind: 'delete',
      summary: `read timeout of ${sk}: the default`,
      payload: { what: 'options', serviceKey: sk, readTimeoutMs: null },
    };
  return {
    key: `options:${sk}`,
    kind: have === undefined ? 'create' : 'update',
    summary: `read timeout of ${sk}: ${ms / 1000} s`,
    payload: { what: 'options', serviceKey: sk, readTimeoutMs: ms },
  };
}

/**
 * A by-host route: set where the document's differs from the data plane's, removed at once for
 * a service that has none (gone, or no longer one our default server may serve): a request for
 * a removed service's host then gets the unknown host's 404, as it would once its site is gone.
 */
function routeAction(sk: string, route: HostRoute | null, have: HostRoute | undefined): Action<SshPayload> {
  if (route === null)
    return {
      key: `host:${sk}`,
      kind: 'delete',
      summary: `no route by host ${have?.host} to ${sk}`,
      payload: { what: 'host', serviceKey: sk, route: null },
    };
  const extras = [route.auth ? 'token checked' : '', route.cors ? 'CORS' : ''].filter(Boolean).join(', ');
  return {
    key: `host:${sk}`,
    kind: have === undefined ? 'create' : 'update',
    summary: `route requests for ${route.host} without a site of their own to ${sk}${extras ? ` (${extras})` : ''}`,
    payload: { what: 'host', serviceKey: sk, route },
  };
}
