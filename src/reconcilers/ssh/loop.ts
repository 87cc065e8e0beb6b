// The SSH loop: desired = one socket per service (or, `sharedSocket`, one socket serving every
// service: each then only counts as served) + one connection per replica (targets.ts);
// observed = what this process holds; plan (plan.ts) = create/update/delete per service
// socket and per replica, by fingerprint, so an unchanged replica is never touched. Tunnels
// live on their own between passes (reconnect, keepalive, probes) and report `Ready` per
// replica as they go, through the handle the controller gives at start().
//
// Outputs, for Nginx, metrics and the CLI: per service its socket path (ServiceSocketOutputs,
// while the socket listens), per replica its reconnects (ReplicaTunnelOutputs).
//
// A removed service is retired, not closed: its socket and tunnels keep serving until the loop
// that routes to them (Nginx, `routedBy`) has finished a Ready pass without it, so no request
// ever reaches a closed socket, nor (shared socket) a service whose replicas have left; then
// they close, and open connections drain in the background for at most `drainMs`. No pass ever
// waits for a drain, so a removal never delays the next change. With `hostRoutes`, what a
// retired service's site still sends is answered as the document says from the pass that
// retired it: its host's new service, or an unknown host's 404 (Replicas.setLeft), so a removal
// is served without waiting for the reload that drops its site.

import type { HostAuthorize } from '../../dataplane/host-auth.js';
import type { ModelApiHandOff } from '../../dataplane/relay-connection.js';
import { join } from 'node:path';
import type { Algorithms } from 'ssh2';
import type { ProxyState } from '../../spec/types.js';
import { backoffPolicy, type BackoffPolicy } from '../backoff.js';
import { systemClock, type Clock } from '../../clock.js';
import {
  defineLoop,
  type Action,
  type BatchOutcome,
  type Loop,
  type LoopContext,
  type LoopHandle,
  type MetricFamily,
  type StatusSnapshot,
} from '../types.js';
import { Balancer, Replicas, type ReplicasOptions } from '../../dataplane/index.js';
import { HostKeyBook } from './host-keys.js';
import { domainsOf } from './host-routes.js';
import { servicesDesired } from './targets.js';
import { replicaLoadStatus, sshMetricFamilies, type ReplicaLoadStatus } from './metrics.js';
import { SharedChains } from './shared-chains.js';
import { PlanIndex } from './plan-index.js';
import { HeldReplicas } from './held-replicas.js';
import { SshApplier } from './apply.js';

export { replicaObjectKey, SSH_LOOP } from '../outputs.js';
export type { ObservedSsh, Retiring, SshDesired, SshPayload } from './plan.js';
import {
  planDifference,
  planSsh,
  type ConvergedServices,
  type ObservedSsh,
  type Retiring,
  type SshDesired,
  type SshPayload,
} from './plan.js';
import { SSH_LOOP } from '../outputs.js';

export interface SshLoopOptions {
  /** Sockets go to <stateDir>/sockets unless socketDir is given. */
  stateDir: string;
  socketDir?: string;
  /** Default 0o660 with socketGid, else 0o600. */
  socketMode?: number;
  socketUid?: number;
  socketGid?: number;
  /**
   * One socket (<socketDir>/dataplane.sock) for every service, the service named per request by
   * the header Nginx sets (src/dataplane/service-header.ts): one upstream in Nginx instead of one
   * per service. Default false: a socket per service.
   */
  sharedSocket?: boolean;
  /**
   * With sharedSocket: another gateway serves this socket dir, and the shared path is pointed at
   * this one's socket only by balancer.publish(), once it serves the document (a hand-over).
   */
  handOver?: boolean;
  /**
   * Keep by-host routes (Replicas.setHostRoute) for the services a default server that names no
   * service may send to the shared socket: those whose site would do nothing but relay (see
   * byHostEligible). Default false.
   */
  hostRoutes?: boolean;
  /** The control-server token check of by-host requests for `auth: true` services (see Balancer). */
  hostAuth?: HostAuthorize;
  /** The gateway's model API, for the entrypoint sites' connections on the shared socket. */
  modelApi?: ModelApiHandOff;
  /** SSH keepalive: a ping every keepaliveIntervalMs, dead after keepaliveCountMax misses. Default 15_000 and 3. */
  keepaliveIntervalMs?: number;
  keepaliveCountMax?: number;
  /** Per hop: TCP + handshake + auth. Default 10_000 (10 s). */
  connectTimeoutMs?: number;
  /** Reconnect backoff. Default 1 s doubling to 60 s, ±20 % jitter. */
  reconnect?: Partial<BackoffPolicy>;
  /** The app port is probed this often while connected. Default 10_000 (10 s). */
  probeIntervalMs?: number;
  /** A channel that has not opened by then counts as failed. Default 10_000 (10 s). */
  channelOpenTimeoutMs?: number;
  /** A removed replica's open connections are closed after this. Default 30_000 (30 s). */
  drainMs?: number;
  /**
   * On close, the shared socket goes on serving for up to this long until another process takes
   * it over (a restart), and then drains. Default 0: it stops at once.
   */
  successorWaitMs?: number;
  /**
   * The loop that routes requests to the sockets (Nginx). A removed service's socket and
   * tunnels stay up until that loop has finished a Ready pass of a generation without the
   * service, plus retireGraceMs; at most drainMs in all. Without it they close at once.
   */
  routedBy?: string;
  /** After the router caught up, the socket stays this long (old workers finishing). Default 1_000. */
  retireGraceMs?: number;
  /** Where the app listens, as seen from the replica. Default 'localhost'. */
  appHost?: string;
  /** ssh2 algorithm preferences (cipher order etc.). Default: ssh2's. */
  algorithms?: Algorithms;
  /**
   * Replicas reached through identical hops (host, port, user, key, pinned fingerprint) share
   * one SSH connection, each request on its own channel (shared-chains.ts). Default true; false
   * gives every replica its own connection.
   */
  shareConnections?: boolean;
  clock?: Clock;
  random?: () => number;
  /** The replicas' upstream pools: read timeout, keep-alive, connections per replica. */
  replicas?: Pick<ReplicasOptions, 'readTimeoutMs' | 'keepAliveTimeoutMs' | 'connectionsPerReplica' | 'logger'>;
}

export interface SshLoopStats {
  /** Removed replicas whose open connections are still draining. */
  draining: number;
}

export interface SshLoop extends Loop<SshDesired, ObservedSsh, SshPayload> {
  /** The sockets Nginx connects to. */
  readonly balancer: Balancer;
  /** The replicas in rotation and the per-request choice: the in-server proxy sends through it. */
  readonly replicas: Replicas;
  /** Drains in the background, which no status shows (the replica has left the document). */
  readonly stats: Readonly<SshLoopStats>;
  /** Requests in flight through a replica in rotation (0 when unknown). */
  activeConnections(replicaId: string): number;
  /** Closes every socket and connection at once; the controller calls it after stop(). Idempotent. */
  close(): Promise<void>;
  /**
   * tunnel_up and tunnel_reconnects_total per replica held; replica_requests_in_flight and
   * replica_requests_total per replica on the books (draining ones included).
   */
  metrics(): readonly MetricFamily[];
  /** Per replica object of the status, its requests now (read at request time, never stored). */
  liveStatus(): Record<string, { load: ReplicaLoadStatus }>;
}

export function createSshLoop(o: SshLoopOptions): SshLoop {
  const clock = o.clock ?? systemClock;
  const random = o.random ?? Math.random;
  const reconnect = backoffPolicy({ baseMs: 1_000, factor: 2, maxMs: 60_000, jitter: 0.2, ...o.reconnect });
  const replicas = new Replicas({
    clock,
    ...(o.connectTimeoutMs !== undefined ? { connectTimeoutMs: o.connectTimeoutMs } : {}),
    ...o.replicas,
  });
  const balancer = new Balancer({
    socketDir: o.socketDir ?? join(o.stateDir, 'sockets'),
    replicas,
    ...(o.sharedSocket ? { shared: true } : {}),
    ...(o.handOver ? { handOver: true } : {}),
    ...(o.socketMode !== undefined ? { socketMode: o.socketMode } : {}),
    ...(o.hostAuth ? { hostAuth: o.hostAuth } : {}),
    ...(o.modelApi ? { modelApi: o.modelApi } : {}),
    ...(o.socketUid !== undefined ? { socketUid: o.socketUid } : {}),
    ...(o.socketGid !== undefined ? { socketGid: o.socketGid } : {}),
    clock,
  });
  const hostKeys = new HostKeyBook();
  const chainOptions = {
    clock,
    hostKeys,
    connectTimeoutMs: o.connectTimeoutMs ?? 10_000,
    keepaliveIntervalMs: o.keepaliveIntervalMs ?? 15_000,
    keepaliveCountMax: o.keepaliveCountMax ?? 3,
    ...(o.algorithms ? { algorithms: o.algorithms } : {}),
    share: o.shareConnections ?? true,
  };
  const chains = new SharedChains(chainOptions);
  const retiring = new Map<string, Retiring>();
  /** The live status between passes (tunnel events); from start(). */
  let handle: LoopHandle | null = null;
  let closing: Promise<void> | null = null;
  const drainMs = o.drainMs ?? 30_000;
  const held = new HeldReplicas({
    replicas,
    chains,
    clock,
    random,
    reconnect,
    probeIntervalMs: o.probeIntervalMs ?? 10_000,
    channelOpenTimeoutMs: o.channelOpenTimeoutMs ?? 10_000,
    connectTimeoutMs: o.connectTimeoutMs ?? 10_000,
    drainMs,
    status: () => handle?.status,
    index: { held: (sk, id) => index.held(sk, id), dropped: (sk, id) => index.dropped(sk, id) },
  });
  // What the plan reads of the held replicas, kept up to date service by service instead of
  // built per pass (see PlanIndex): a pass after a one-service change costs that service.
  const index = new PlanIndex({
    heldReplicas: held.map,
    retiring,
    listening: balancer.listeningKeys(),
    readTimeouts: replicas.serviceReadTimeouts(),
    hostRoutes: replicas.hostRoutes(),
  });
  /** Services found converged by earlier passes (planSsh). */
  const converged: ConvergedServices = new WeakMap();
  const applier = new SshApplier({
    balancer,
    replicas,
    held,
    hostKeys,
    index,
    retiring,
    routed: o.routedBy !== undefined,
    drainMs,
    graceMs: o.retireGraceMs ?? 1_000,
  });

  const loop = defineLoop({
    name: SSH_LOOP,
    ...(o.routedBy ? { watches: [o.routedBy] } : {}),
    balancer,
    replicas,
    stats: held.stats,

    start(h: LoopHandle): void {
      handle = h;
    },

    desired(spec: ProxyState, statuses: StatusSnapshot): SshDesired {
      let routedUpTo = Infinity;
      if (o.routedBy) {
        const ready = statuses.loops[o.routedBy]?.conditions.find((c) => c.type === 'Ready');
        routedUpTo = ready?.status === 'True' ? (ready.observedGeneration ?? -1) : -1;
      }
      return {
        services: servicesDesired(spec, o.appHost),
        generation: statuses.generation,
        routedUpTo,
        ...(o.hostRoutes ? { hostRoutes: true, domains: () => domainsOf(spec) } : {}),
      };
    },

    // The status is written where it changes (a replica held or dropped, a tunnel's report, a
    // socket opened or closed), not restated here: a pass costs what changed, not one write
    // per replica. An object left as it was keeps its observedGeneration; the loop's own Ready
    // condition says which generation its last pass saw.
    async observe(ctx: LoopContext): Promise<ObservedSsh> {
      index.refresh();
      return {
        services: balancer.listeningKeys(),
        replicas: index.replicas,
        replicasByService: index.byService,
        facts: index.facts,
        // Copied: applying the plan changes the entries.
        retiring: new Map([...retiring].map(([k, r]) => [k, { ...r, replicas: new Set(r.replicas) }])),
        now: ctx.clock.now(),
        readTimeouts: loop.replicas.serviceReadTimeouts(),
        hosts: loop.replicas.hostRoutes(),
      };
    },

    plan(desired: SshDesired, observed: ObservedSsh): Action<SshPayload>[] {
      const actions = planSsh(desired, observed, drainMs, converged);
      if (CHECK_PLANS) {
        // Every service compared again, from the held replicas alone: what skipping must equal.
        const full = planSsh(desired, { ...observed, facts: undefined, replicasByService: undefined }, drainMs);
        const diff = planDifference(actions, full);
        if (diff !== null) throw new Error(`the SSH plan that skipped converged services differs from the full one: ${diff}`);
      }
      return actions;
    },

    applyBatch(actions: Action<SshPayload>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>> {
      return applier.apply(actions, ctx);
    },

    activeConnections(replicaId: string): number {
      return held.activeConnections(replicaId);
    },

    close(): Promise<void> {
      closing ??= (async () => {
        handle = null;
        // First the sockets: when another gateway has taken the data plane over, what Nginx
        // still sends here finishes over these tunnels (at most drainMs) before they close.
        await balancer.close({ drainMs, successorWaitMs: o.successorWaitMs ?? 0 });
        held.closeAll();
        retiring.clear();
        index.clear();
        await replicas.close(); // destroys open connections: drains end at once
        await held.drained();
      })();
      return closing;
    },

    metrics(): readonly MetricFamily[] {
      return sshMetricFamilies(
        () => [...held.map].map(([id, h]) => [h.desired.serviceKey, id, h.state()]),
        (id) => held.reconnects(id),
        replicas,
        () => chains.size,
      );
    },

    liveStatus(): Record<string, { load: ReplicaLoadStatus }> {
      return replicaLoadStatus(replicas);
    },
  });
  return loop satisfies SshLoop;
}

/**
 * With DSTACK_PROXY_CHECK_PLANS=1 (the test suite sets it) every SSH pass also plans without
 * skipping converged services and fails if the two plans differ: a write the plan index missed
 * shows there, not as a replica left unconnected in production.
 */
const CHECK_PLANS = process.env.DSTACK_PROXY_CHECK_PLANS === '1';
