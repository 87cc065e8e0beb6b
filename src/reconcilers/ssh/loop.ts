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

import { connect as netConnect } from 'node:net';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
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
  type StatusWriter,
} from '../types.js';
import { Balancer, Replicas, type ReplicasOptions, type Upstream } from '../../dataplane/index.js';
import { HostKeyBook } from './host-keys.js';
import { domainsOf } from './host-routes.js';
import { describeTarget, servicesDesired, type DesiredReplica } from './targets.js';
import { replicaLoadStatus, sshMetricFamilies, type ReplicaLoadStatus } from './metrics.js';
import { ReplicaTunnel, type TunnelState } from './tunnel.js';
import { SharedChains } from './shared-chains.js';
import { PlanIndex } from './plan-index.js';

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
import { replicaObjectKey, SSH_LOOP, type ReplicaTunnelOutputs, type ServiceSocketOutputs } from '../outputs.js';

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
   * Keep by-host routes (Replicas.setHostRoute) for the services a default server that names no
   * service may send to the shared socket: those whose site would do nothing but relay (see
   * byHostEligible). Default false.
   */
  hostRoutes?: boolean;
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

interface Held {
  desired: DesiredReplica;
  upstream: Upstream;
  tunnel: ReplicaTunnel | null;
  state: () => TunnelState;
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
    ...(o.socketMode !== undefined ? { socketMode: o.socketMode } : {}),
    ...(o.socketUid !== undefined ? { socketUid: o.socketUid } : {}),
    ...(o.socketGid !== undefined ? { socketGid: o.socketGid } : {}),
  });
  const hostKeys = new HostKeyBook();
  const chainOptions = {
    hostKeys,
    connectTimeoutMs: o.connectTimeoutMs ?? 10_000,
    keepaliveIntervalMs: o.keepaliveIntervalMs ?? 15_000,
    keepaliveCountMax: o.keepaliveCountMax ?? 3,
    ...(o.algorithms ? { algorithms: o.algorithms } : {}),
    share: o.shareConnections ?? true,
  };
  const chains = new SharedChains(chainOptions);
  const held = new Map<string, Held>();
  const retiring = new Map<string, Retiring>();
  // What the plan reads of the held replicas, kept up to date service by service instead of
  // built per pass (see PlanIndex): a pass after a one-service change costs that service.
  const index = new PlanIndex({
    heldReplicas: held,
    retiring,
    listening: balancer.listeningKeys(),
    readTimeouts: replicas.serviceReadTimeouts(),
    hostRoutes: replicas.hostRoutes(),
  });
  /** Services found converged by earlier passes (planSsh). */
  const converged: ConvergedServices = new WeakMap();
  const drainMs = o.drainMs ?? 30_000;
  const graceMs = o.retireGraceMs ?? 1_000;
  const draining = new Set<Promise<void>>();
  const stats: SshLoopStats = { draining: 0 };
  /** Successful SSH logins per replica id, for the reconnect output and metric. */
  const connects = new Map<string, number>();
  const reconnects = (id: string): number => Math.max(0, (connects.get(id) ?? 0) - 1);
  /** The live status between passes (tunnel events); from start(). */
  let handle: LoopHandle | null = null;
  let closing: Promise<void> | null = null;

  /** What a tunnel reports about itself: its Ready condition and its reconnects. */
  const report = (d: DesiredReplica, s: TunnelState, status: StatusWriter | undefined = handle?.status): void => {
    if (held.get(d.id)?.desired !== d) return; // replaced or removed meanwhile
    if (status === undefined) return; // not started by a controller, or closed
    const key = replicaObjectKey(d.serviceKey, d.id);
    status.set(key, { type: 'Ready', status: s.ready ? 'True' : 'False', reason: s.reason, message: s.message });
    status.setOutputs(key, { reconnects: reconnects(d.id) } satisfies ReplicaTunnelOutputs);
  };

  const socketOutputs = (sk: string): ServiceSocketOutputs => ({ socketPath: balancer.socketPathFor(sk) });

  /** Puts a replica in rotation; its tunnel, if it has one, starts connecting. */
  const hold = (d: DesiredReplica, ctx: LoopContext): void => {
    const t = d.target;
    let h: Held;
    if (d.problem !== null) {
      const state: TunnelState = { ready: false, reason: 'InvalidConfig', message: d.problem };
      h = {
        desired: d,
        tunnel: null,
        state: () => state,
        upstream: { isReady: () => false, open: () => Promise.reject(new Error(d.problem ?? '')) },
      };
    } else if (t.kind === 'direct') {
      const state: TunnelState = { ready: true, reason: 'Connected', message: `direct ${describeTarget(t)}` };
      h = {
        desired: d,
        tunnel: null,
        state: () => state,
        upstream: { isReady: () => true, open: () => openTcp(t.host, t.port, o.connectTimeoutMs ?? 10_000) },
      };
    } else {
      const tunnel = new ReplicaTunnel({
        target: t,
        chains,
        hostKeyScope: { policy: t.hostKeyPolicy ?? 'tofu', replicaId: d.id },
        clock,
        random,
        reconnect,
        probeIntervalMs: o.probeIntervalMs ?? 10_000,
        channelOpenTimeoutMs: o.channelOpenTimeoutMs ?? 10_000,
        onState: (s) => {
          report(d, s);
          ctx.logger.info({ replica: d.id, service: d.serviceKey, reason: s.reason, ready: s.ready }, s.message);
        },
        onConnected: () => {
          connects.set(d.id, (connects.get(d.id) ?? 0) + 1);
          report(d, tunnel.state);
        },
      });
      h = { desired: d, tunnel, upstream: tunnel, state: () => tunnel.state };
    }
    held.set(d.id, h);
    index.held(d.serviceKey, d.id);
    replicas.set(d.serviceKey, d.id, h.upstream);
    report(d, h.state(), ctx.status);
    h.tunnel?.start();
  };

  /** Takes a replica out of rotation at once; its open connections drain in the background. */
  const dropReplica = (id: string, serviceKey: string): void => {
    const h = held.get(id);
    replicas.remove(serviceKey, id); // out of rotation at once
    if (!h) return;
    held.delete(id);
    index.dropped(h.desired.serviceKey, id);
    const p = replicas.drain(h.upstream, drainMs).then(() => h.tunnel?.close());
    draining.add(p);
    stats.draining = draining.size;
    void p.finally(() => {
      draining.delete(p);
      stats.draining = draining.size;
    });
  };

  /** Nothing routes to a retired service any more: its replicas leave, its socket closes. */
  const closeService = async (sk: string, ctx: LoopContext): Promise<void> => {
    const r = retiring.get(sk);
    retiring.delete(sk);
    index.touch(sk);
    replicas.clearLeft(sk);
    for (const id of r?.replicas ?? []) {
      if (held.get(id)?.desired.serviceKey !== sk) continue; // reused by another service meanwhile
      dropReplica(id, sk);
      ctx.status.delete(replicaObjectKey(sk, id));
    }
    await balancer.unlisten(sk);
    index.touch(sk);
    ctx.status.setOutputs(sk, undefined);
  };

  const loop = defineLoop({
    name: SSH_LOOP,
    ...(o.routedBy ? { watches: [o.routedBy] } : {}),
    balancer,
    replicas,
    stats,

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

    async applyBatch(actions: Action<SshPayload>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>> {
      const outcomes = new Map<string, BatchOutcome>();
      const listen: string[] = [];
      const unlisten: string[] = [];
      const now = ctx.clock.now();
      // 0. Removed services retire: socket and replicas keep serving while the router may
      //    still send them requests (it is told in the same round, after this pass).
      for (const action of actions) {
        const p = action.payload;
        if (p.what === 'restore') {
          retiring.delete(p.serviceKey);
          index.touch(p.serviceKey);
          replicas.clearLeft(p.serviceKey);
          outcomes.set(action.key, 'done');
        } else if (p.what === 'service' && action.kind === 'delete' && o.routedBy) {
          const ids = index.heldUnder(p.serviceKey);
          retiring.set(p.serviceKey, { since: ctx.generation, at: now, caughtUpAt: null, replicas: ids });
          index.touch(p.serviceKey);
          // Its requests from the site Nginx still has are answered as the document says now.
          if (p.claimed) replicas.setLeft(p.serviceKey, p.claimed);
          // Come back when the drain period is over even if the router never catches up.
          outcomes.set(action.key, { requeueAfterMs: drainMs });
        } else if (p.what === 'close') {
          const r = retiring.get(p.serviceKey);
          if (r && r.caughtUpAt === null) r.caughtUpAt = now;
          const wait = r && now - r.at < drainMs ? r.caughtUpAt! + graceMs - now : 0;
          if (wait > 0) outcomes.set(action.key, { requeueAfterMs: wait });
          else unlisten.push(p.serviceKey);
        }
      }
      // 1. Replicas (in memory, at once): a socket that starts listening below already has its
      //    replicas in rotation; those of a retiring service stay until it closes.
      for (const action of actions) {
        const p = action.payload;
        if (p.what === 'host') {
          replicas.setHostRoute(p.serviceKey, p.host);
          index.touch(p.serviceKey);
          outcomes.set(action.key, 'done');
          continue;
        }
        if (p.what === 'options') {
          replicas.setServiceOptions(p.serviceKey, p.readTimeoutMs === null ? {} : { readTimeoutMs: p.readTimeoutMs });
          index.touch(p.serviceKey);
          outcomes.set(action.key, 'done');
          continue;
        }
        if (p.what === 'service') {
          if (action.kind !== 'delete') listen.push(p.serviceKey);
          else if (!o.routedBy) unlisten.push(p.serviceKey);
          continue;
        }
        if (p.what !== 'replica') continue;
        try {
          const id = action.key.slice('replica:'.length);
          const r = p.previous ? retiring.get(p.previous.serviceKey) : undefined;
          if (p.replica === null && r?.replicas.has(id)) {
            outcomes.set(action.key, 'done'); // closes with its service
            continue;
          }
          const prev = p.previous ?? (held.has(id) ? { serviceKey: held.get(id)!.desired.serviceKey } : null);
          if (prev) {
            retiring.get(prev.serviceKey)?.replicas.delete(id);
            dropReplica(id, prev.serviceKey);
            ctx.status.delete(replicaObjectKey(prev.serviceKey, id));
          }
          if (p.replica) hold(p.replica, ctx);
          outcomes.set(action.key, 'done');
        } catch (error) {
          outcomes.set(action.key, { error });
        }
      }
      // Replicas that left (no longer held) leave no trust behind; before any await, so no
      // handshake of a tunnel started above is judged by a departed replica's keys.
      hostKeys.retain(held);
      // 2. Sockets: closed ones (at once; their open connections drain in the background),
      //    then new ones bound several at a time (1,000s on a cold start).
      await Promise.all(
        unlisten.map((sk) =>
          closeService(sk, ctx).then(
            () => outcomes.set(`service:${sk}`, 'done'),
            (error: unknown) => outcomes.set(`service:${sk}`, { error }),
          ),
        ),
      );
      const failed = await balancer.listenAll(listen);
      for (const sk of listen) {
        index.touch(sk);
        if (failed.has(sk)) {
          outcomes.set(`service:${sk}`, { error: failed.get(sk) });
          continue;
        }
        ctx.status.setOutputs(sk, socketOutputs(sk));
        outcomes.set(`service:${sk}`, 'done');
      }
      hostKeys.retain(held); // and those of services closed above
      return outcomes;
    },

    activeConnections(replicaId: string): number {
      const h = held.get(replicaId);
      return h ? replicas.inFlight(h.upstream) : 0;
    },

    close(): Promise<void> {
      closing ??= (async () => {
        handle = null;
        for (const h of held.values()) h.tunnel?.close();
        held.clear();
        retiring.clear();
        index.clear();
        await balancer.close();
        await replicas.close(); // destroys open connections: drains end at once
        await Promise.all(draining);
      })();
      return closing;
    },

    metrics(): readonly MetricFamily[] {
      return sshMetricFamilies(
        () => [...held].map(([id, h]) => [h.desired.serviceKey, id, h.state()]),
        reconnects,
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

function openTcp(host: string, port: number, timeoutMs: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    const sock = netConnect({ host, port, noDelay: true });
    sock.setTimeout(timeoutMs, () => sock.destroy(new Error(`connect to ${host}:${port} timed out`)));
    sock.once('connect', () => {
      sock.setTimeout(0);
      resolve(sock);
    });
    sock.once('error', reject);
  });
}

/**
 * With DSTACK_PROXY_CHECK_PLANS=1 (the test suite sets it) every SSH pass also plans without
 * skipping converged services and fails if the two plans differ: a write the plan index missed
 * shows there, not as a replica left unconnected in production.
 */
const CHECK_PLANS = process.env.DSTACK_PROXY_CHECK_PLANS === '1';
