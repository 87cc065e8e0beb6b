// What the SSH loop wants, derived purely from the spec: one listening socket per service and,
// per replica, the chain of hops (head proxy → proxy → destination) or the direct address.
// `fingerprint` is a hash of everything that defines a connection: equal fingerprints mean
// "leave the connection alone" (a resync or an identical PUT touches nothing).

import { createHash } from 'node:crypto';
import type { HostKeyPolicy, ProxyState, Replica, Service, SshHop, SshProxyHop } from '../../spec/types.js';
import { DEFAULT_SSH_PORT, serviceKey } from '../../spec/types.js';
import { privateKeyReader, type UsableKey } from '../../spec/keys.js';
import type { HostRoute } from '../../dataplane/service-header.js';
import { byHostEligible, hostRouteOf } from './host-routes.js';

export interface HopTarget {
  host: string;
  port: number;
  user: string;
  /** Secret: in memory only. */
  privateKey: string;
  hostKeyFingerprint?: string;
}

export type ReplicaTarget =
  | {
      kind: 'ssh';
      hops: HopTarget[];
      appHost: string;
      appPort: number;
      /** Absent: `tofu`. Part of the fingerprint: a changed policy reconnects with the other trust. */
      hostKeyPolicy?: HostKeyPolicy;
    }
  | { kind: 'direct'; host: string; port: number };

export interface DesiredReplica {
  id: string;
  serviceKey: string;
  target: ReplicaTarget;
  /** sha256 over serviceKey + target (keys included); never shown. */
  fingerprint: string;
  /** Why the replica cannot be connected, e.g. no private key; null when fine. */
  problem: string | null;
}

export interface DesiredSsh {
  services: Set<string>;
  replicas: Map<string, DesiredReplica>;
}

/** What one service asks of the SSH loop; one object per service object (see perService). */
export interface ServiceDesired {
  serviceKey: string;
  replicas: readonly DesiredReplica[];
  /** Its own read timeout in ms; undefined: the data plane's default. */
  readTimeoutMs: number | undefined;
  /** Its domain in lower case, as Nginx's $host; undefined without one. */
  domain: string | undefined;
  /** Its by-host route when our default server may relay to it by Host. */
  byHost: HostRoute | undefined;
}

/** Pure: the sockets and connections the spec asks for. */
export function desiredFromSpec(state: ProxyState, appHost = 'localhost'): DesiredSsh {
  const services = new Set<string>();
  const replicas = new Map<string, DesiredReplica>();
  for (const d of servicesDesired(state, appHost)) {
    services.add(d.serviceKey);
    for (const r of d.replicas) replicas.set(r.id, r);
  }
  return { services, replicas };
}

/**
 * Pure: per service of the spec, in its order, what it asks of the SSH loop. The list is kept per
 * services list and each entry per service object, so a pass after a one-service change builds
 * one entry and walks the others' pointers.
 */
export function servicesDesired(state: ProxyState, appHost = 'localhost'): readonly ServiceDesired[] {
  const { services, projects } = state.spec;
  const listed = perList.get(services);
  if (listed !== undefined && listed.projects === projects && listed.appHost === appHost) return listed.list;
  const readKey = privateKeyReader();
  const keys = new Map(projects.map((p) => [p.name, p.sshPrivateKey]));
  const list = services.map((s) => {
    const projectKey = keys.get(s.project);
    let memo = perService.get(s);
    if (memo === undefined || memo.projectKey !== projectKey || memo.appHost !== appHost) {
      const sk = serviceKey(s);
      const domain = s.domain?.toLowerCase();
      memo = {
        projectKey,
        appHost,
        desired: {
          serviceKey: sk,
          replicas: s.replicas.map((r) => {
            const { target, problem } = targetOf(r, projectKey, appHost, readKey);
            return { id: r.id, serviceKey: sk, target, problem, fingerprint: fingerprintOf(sk, target) };
          }),
          readTimeoutMs: s.readTimeout === undefined ? undefined : s.readTimeout * 1000,
          domain,
          byHost: byHostEligible(s) ? hostRouteOf(s) : undefined,
        },
      };
      perService.set(s, memo);
    }
    return memo.desired;
  });
  perList.set(services, { projects, appHost, list });
  return list;
}

/**
 * A service's entry as servicesDesired built it, per service object: a normalised service is
 * never changed in place (an update is a new object, the untouched ones are shared between
 * generations), so a pass re-reads keys and hashes targets only for the services that changed.
 * The project key and appHost are the other inputs, checked on every use.
 */
const perService = new WeakMap<Service, { projectKey: string | undefined; appHost: string; desired: ServiceDesired }>();

/** The whole list per services list: a pass that reads the same document again builds nothing. */
const perList = new WeakMap<readonly Service[], { projects: unknown; appHost: string; list: readonly ServiceDesired[] }>();

function targetOf(
  r: Replica,
  projectKey: string | undefined,
  appHost: string,
  readKey: (text: string) => UsableKey,
): { target: ReplicaTarget; problem: string | null } {
  if (r.direct) return { target: { kind: 'direct', host: r.direct.host, port: r.direct.port }, problem: null };
  const hops: HopTarget[] = [];
  let problem: string | null = null;
  const add = (hop: SshHop | SshProxyHop | undefined, name: string): void => {
    if (!hop) return;
    const key = ('privateKey' in hop ? hop.privateKey : undefined) ?? projectKey;
    if (!key) problem ??= `no private key for the ${name} hop ${hop.user}@${hop.host}`;
    const h: HopTarget = {
      host: hop.host,
      port: hop.port ?? DEFAULT_SSH_PORT,
      user: hop.user,
      privateKey: key ? forSsh2(key, readKey) : '',
    };
    if (hop.hostKeyFingerprint) h.hostKeyFingerprint = hop.hostKeyFingerprint;
    hops.push(h);
  };
  add(r.sshHeadProxy, 'head proxy');
  add(r.sshProxy, 'proxy');
  add(r.ssh, 'destination');
  if (!r.ssh) problem ??= 'the replica has neither ssh nor direct';
  const target: ReplicaTarget = { kind: 'ssh', hops, appHost, appPort: r.appPort };
  if (r.hostKeyPolicy !== undefined && r.hostKeyPolicy !== 'tofu') target.hostKeyPolicy = r.hostKeyPolicy;
  return { target, problem };
}

/**
 * The key as ssh2 reads it: PKCS#8 converted (once per distinct key: the reader memoises).
 * A key validation would refuse — only in a state built in code — goes on as it is, and
 * connecting reports ssh2's reason.
 */
function forSsh2(key: string, readKey: (text: string) => UsableKey): string {
  const usable = readKey(key);
  return usable.ok ? usable.key : key;
}

function fingerprintOf(sk: string, target: ReplicaTarget): string {
  return createHash('sha256')
    .update(JSON.stringify([sk, target]))
    .digest('hex');
}

/** A description safe for logs and plans: the hops without keys. */
export function describeTarget(t: ReplicaTarget): string {
  if (t.kind === 'direct') return `direct ${t.host}:${t.port}`;
  return `${t.hops.map((h) => `${h.user}@${h.host}:${h.port}`).join(' → ')} → ${t.appHost}:${t.appPort}`;
}
