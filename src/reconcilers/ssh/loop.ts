// The SSH loop: desired = one socket per service + one connection per replica (targets.ts);
// observed = what this process holds; plan = create/update/delete per service socket and per
// replica, by fingerprint, so an unchanged replica is never touched. Tunnels live on their
// own between passes (reconnect, keepalive, probes) and report `Ready` per replica as they go.
//
// A removed service is retired, not closed: its socket and tunnels keep serving until the loop
// that routes to them (Nginx, `routedBy`) has finished a Ready pass without it, so no request
// ever reaches a closed socket; then they close, and open connections drain in the background
// for at most `drainMs`. No pass ever waits for a drain, so a removal never delays the next change.

import { connect as netConnect } from 'node:net';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { Algorithms } from 'ssh2';
import type { ProxyState } from '../../spec/types.js';
import { backoffPolicy, type BackoffPolicy } from '../backoff.js';
import { systemClock, type Clock } from '../../clock.js';
import type { Action, BatchOutcome, Loop, LoopContext, StatusSnapshot, StatusWriter } from '../types.js';
import { Balancer, type Upstream } from './balancer.js';
import { HostKeyBook } from './host-keys.js';
import { describeTarget, desiredFromSpec, type DesiredReplica, type DesiredSsh } from './targets.js';
import { ReplicaTunnel, type TunnelState } from './tunnel.js';

export { replicaObjectKey, SSH_LOOP } from '../outputs.js';
import { replicaObjectKey, SSH_LOOP } from '../outputs.js';

export interface SshLoopOptions {
  /** Sockets go to <stateDir>/sockets unless socketDir is given. */
  stateDir: string;
  socketDir?: string;
  /** Default 0o660 with socketGid, else 0o600. */
  socketMode?: number;
  socketUid?: number;
  socketGid?: number;
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
  clock?: Clock;
  random?: () => number;
}

export interface SshLoopStats {
  /** Completed handshakes of whole hop chains. */
  sshConnects: number;
  tunnels: number;
  draining: number;
}

interface Held {
  desired: DesiredReplica;
  upstream: Upstream;
  tunnel: ReplicaTunnel | null;
  state: () => TunnelState;
}

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

export type SshLoop = Loop<SshDesired, ObservedSsh, SshPayload> & {
  balancer: Balancer;
  stats: SshLoopStats;
  /** Open connections through a replica in rotation (0 when unknown). */
  activeConnections(replicaId: string): number;
  /** Successful SSH logins to a replica since the process started (1 + reconnects). */
  connects(replicaId: string): number;
  /** Closes every socket and connection at once (shutdown; after controller.stop()). */
  close(): Promise<void>;
};

export function createSshLoop(o: SshLoopOptions): SshLoop {
  const clock = o.clock ?? systemClock;
  const random = o.random ?? Math.random;
  const reconnect = backoffPolicy({ baseMs: 1_000, factor: 2, maxMs: 60_000, jitter: 0.2, ...o.reconnect });
  const balancer = new Balancer({
    socketDir: o.socketDir ?? join(o.stateDir, 'sockets'),
    random,
    clock,
    ...(o.socketMode !== undefined ? { socketMode: o.socketMode } : {}),
    ...(o.socketUid !== undefined ? { socketUid: o.socketUid } : {}),
    ...(o.socketGid !== undefined ? { socketGid: o.socketGid } : {}),
  });
  const hostKeys = new HostKeyBook();
  const held = new Map<string, Held>();
  const retiring = new Map<string, Retiring>();
  const drainMs = o.drainMs ?? 30_000;
  const graceMs = o.retireGraceMs ?? 1_000;
  const draining = new Set<Promise<void>>();
  const stats: SshLoopStats = { sshConnects: 0, tunnels: 0, draining: 0 };
  /** Successful SSH logins per replica id, for the reconnect metric. */
  const connects = new Map<string, number>();
  let writer: StatusWriter | null = null;

  const report = (d: DesiredReplica, s: TunnelState): void => {
    if (held.get(d.id)?.desired !== d) return; // replaced or removed meanwhile
    writer?.set(replicaObjectKey(d.serviceKey, d.id), { type: 'Ready', status: s.ready ? 'True' : 'False', reason: s.reason, message: s.message });
  };

  const start = (d: DesiredReplica, ctx: LoopContext): void => {
    const t = d.target;
    let h: Held;
    if (d.problem !== null) {
      const state: TunnelState = { ready: false, reason: 'InvalidConfig', message: d.problem };
      h = { desired: d, tunnel: null, state: () => state, upstream: { isReady: () => false, open: () => Promise.reject(new Error(d.problem ?? '')) } };
    } else if (t.kind === 'direct') {
      const state: TunnelState = { ready: true, reason: 'Connected', message: `direct ${describeTarget(t)}` };
      h = { desired: d, tunnel: null, state: () => state, upstream: { isReady: () => true, open: () => openTcp(t.host, t.port, o.connectTimeoutMs ?? 10_000) } };
    } else {
      const tunnel = new ReplicaTunnel({
        target: t,
        hostKeys,
        clock,
        random,
        reconnect,
        connectTimeoutMs: o.connectTimeoutMs ?? 10_000,
        keepaliveIntervalMs: o.keepaliveIntervalMs ?? 15_000,
        keepaliveCountMax: o.keepaliveCountMax ?? 3,
        probeIntervalMs: o.probeIntervalMs ?? 10_000,
        channelOpenTimeoutMs: o.channelOpenTimeoutMs ?? 10_000,
        ...(o.algorithms ? { algorithms: o.algorithms } : {}),
        onState: (s) => {
          report(d, s);
          ctx.logger.info({ replica: d.id, service: d.serviceKey, reason: s.reason, ready: s.ready }, s.message);
        },
        onConnected: () => {
          stats.sshConnects++;
          connects.set(d.id, (connects.get(d.id) ?? 0) + 1);
        },
      });
      h = { desired: d, tunnel, upstream: tunnel, state: () => tunnel.state };
    }
    held.set(d.id, h);
    stats.tunnels = held.size;
    balancer.setReplica(d.serviceKey, d.id, h.upstream);
    report(d, h.state());
    h.tunnel?.start();
  };

  const stop = (id: string, serviceKey: string): void => {
    const h = held.get(id);
    balancer.removeReplica(serviceKey, id); // out of rotation at once
    if (!h) return;
    held.delete(id);
    stats.tunnels = held.size;
    const p = balancer.drain(h.upstream, drainMs).then(() => h.tunnel?.close());
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
    for (const id of r?.replicas ?? []) {
      if (held.get(id)?.desired.serviceKey !== sk) continue; // reused by another service meanwhile
      stop(id, sk);
      ctx.status.delete(replicaObjectKey(sk, id));
    }
    await balancer.unlisten(sk);
  };

  return {
    name: SSH_LOOP,
    ...(o.routedBy ? { watches: [o.routedBy] } : {}),
    balancer,
    stats,
    connects: (replicaId) => connects.get(replicaId) ?? 0,

    desired(spec: ProxyState, statuses: StatusSnapshot): SshDesired {
      let routedUpTo = Infinity;
      if (o.routedBy) {
        const ready = statuses.loops[o.routedBy]?.conditions.find((c) => c.type === 'Ready');
        routedUpTo = ready?.status === 'True' ? (ready.observedGeneration ?? -1) : -1;
      }
      return { ...desiredFromSpec(spec, o.appHost), generation: statuses.generation, routedUpTo };
    },

    async observe(ctx: LoopContext): Promise<ObservedSsh> {
      const replicas = new Map<string, { serviceKey: string; fingerprint: string }>();
      const keep: string[] = [];
      for (const [id, h] of held) {
        if (!retiring.get(h.desired.serviceKey)?.replicas.has(id)) replicas.set(id, { serviceKey: h.desired.serviceKey, fingerprint: h.desired.fingerprint });
        const key = replicaObjectKey(h.desired.serviceKey, id);
        keep.push(key);
        const st = h.state();
        ctx.status.set(key, { type: 'Ready', status: st.ready ? 'True' : 'False', reason: st.reason, message: st.message });
      }
      ctx.status.prune(keep);
      return { services: new Set(balancer.listening()), replicas, retiring: new Map([...retiring].map(([k, r]) => [k, { ...r, replicas: new Set(r.replicas) }])), now: ctx.clock.now() };
    },

    plan(desired: SshDesired, observed: ObservedSsh): Action<SshPayload>[] {
      const actions: Action<SshPayload>[] = [];
      const gone = observed.retiring ?? new Map<string, Retiring>();
      for (const sk of desired.services) {
        if (gone.has(sk)) actions.push({ key: `service:${sk}`, kind: 'restore', summary: `keep the socket of ${sk} (back in the document)`, payload: { what: 'restore', serviceKey: sk } });
        else if (!observed.services.has(sk)) actions.push({ key: `service:${sk}`, kind: 'create', summary: `listen on the socket of ${sk}`, payload: { what: 'service', serviceKey: sk } });
      }
      for (const sk of observed.services) {
        if (desired.services.has(sk)) continue;
        const r = gone.get(sk);
        if (!r) actions.push({ key: `service:${sk}`, kind: 'delete', summary: `close the socket of ${sk}`, payload: { what: 'service', serviceKey: sk } });
        else if (desired.routedUpTo >= r.since || (observed.now ?? 0) - r.at >= drainMs) {
          actions.push({ key: `service:${sk}`, kind: 'close', summary: `close the socket of ${sk}: nothing routes to it any more`, payload: { what: 'close', serviceKey: sk } });
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
        actions.push({ key: `replica:${id}`, kind: 'delete', summary: `close the tunnel of replica ${id} of ${cur.serviceKey}`, payload: { what: 'replica', replica: null, previous: { serviceKey: cur.serviceKey } } });
      }
      return actions;
    },

    async applyBatch(actions: Action<SshPayload>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>> {
      writer = ctx.status;
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
          outcomes.set(action.key, 'done');
        } else if (p.what === 'service' && action.kind === 'delete' && o.routedBy) {
          const replicas = new Set([...held].filter(([, h]) => h.desired.serviceKey === p.serviceKey).map(([id]) => id));
          retiring.set(p.serviceKey, { since: ctx.generation, at: now, caughtUpAt: null, replicas });
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
            stop(id, prev.serviceKey);
            ctx.status.delete(replicaObjectKey(prev.serviceKey, id));
          }
          if (p.replica) start(p.replica, ctx);
          outcomes.set(action.key, 'done');
        } catch (error) {
          outcomes.set(action.key, { error });
        }
      }
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
      for (const sk of listen) outcomes.set(`service:${sk}`, failed.has(sk) ? { error: failed.get(sk) } : 'done');
      return outcomes;
    },

    activeConnections(replicaId: string): number {
      const h = held.get(replicaId);
      return h ? balancer.activeConnections(h.upstream) : 0;
    },

    async close(): Promise<void> {
      for (const h of held.values()) h.tunnel?.close();
      held.clear();
      retiring.clear();
      await balancer.close(); // destroys open connections: drains end at once
      await Promise.all(draining);
    },
  };
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
