// The replicas the SSH loop holds: each in rotation behind its tunnel (or a direct connection,
// or nothing when its entry has a problem), what each tunnel reports about itself (its Ready
// condition and reconnects, through the live status), and its departure: out of rotation at
// once, its open connections drained in the background.

import { connect as netConnect } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Clock } from '../../clock.js';
import type { Replicas, Upstream } from '../../dataplane/index.js';
import type { BackoffPolicy } from '../backoff.js';
import { replicaObjectKey, type ReplicaTunnelOutputs } from '../outputs.js';
import type { LoopContext, StatusWriter } from '../types.js';
import type { SharedChains } from './shared-chains.js';
import { describeTarget, type DesiredReplica } from './targets.js';
import { ReplicaTunnel, type TunnelState } from './tunnel.js';

export interface Held {
  desired: DesiredReplica;
  upstream: Upstream;
  tunnel: ReplicaTunnel | null;
  state: () => TunnelState;
}

export interface HeldReplicasOptions {
  replicas: Replicas;
  chains: SharedChains;
  clock: Clock;
  random: () => number;
  reconnect: BackoffPolicy;
  probeIntervalMs: number;
  channelOpenTimeoutMs: number;
  /** A direct replica's TCP connect. */
  connectTimeoutMs: number;
  /** A departed replica's open connections are closed after this. */
  drainMs: number;
  /** The live status between passes; undefined before the loop starts and once it closed. */
  status: () => StatusWriter | undefined;
  /** What the plan reads of the replicas (PlanIndex): told of every replica held or dropped. */
  index: { held(serviceKey: string, id: string): void; dropped(serviceKey: string, id: string): void };
}

export class HeldReplicas {
  /** By replica id. */
  readonly map = new Map<string, Held>();
  readonly #o: HeldReplicasOptions;
  /** Successful SSH logins per replica id, for the reconnect output and metric. */
  readonly #connects = new Map<string, number>();
  readonly #draining = new Set<Promise<void>>();
  /** Removed replicas whose open connections are still draining. */
  readonly stats = { draining: 0 };

  constructor(o: HeldReplicasOptions) {
    this.#o = o;
  }

  reconnects(id: string): number {
    return Math.max(0, (this.#connects.get(id) ?? 0) - 1);
  }

  /** Puts a replica in rotation; its tunnel, if it has one, starts connecting. */
  hold(d: DesiredReplica, ctx: LoopContext): void {
    const h = this.#make(d, ctx);
    this.map.set(d.id, h);
    this.#o.index.held(d.serviceKey, d.id);
    this.#o.replicas.set(d.serviceKey, d.id, h.upstream);
    this.#report(d, h.state(), ctx.status);
    h.tunnel?.start();
  }

  /** Takes a replica out of rotation at once; its open connections drain in the background. */
  drop(id: string, serviceKey: string): void {
    const h = this.map.get(id);
    this.#o.replicas.remove(serviceKey, id); // out of rotation at once
    if (!h) return;
    this.map.delete(id);
    this.#o.index.dropped(h.desired.serviceKey, id);
    const p = this.#o.replicas.drain(h.upstream, this.#o.drainMs).then(() => h.tunnel?.close());
    this.#draining.add(p);
    this.stats.draining = this.#draining.size;
    void p.finally(() => {
      this.#draining.delete(p);
      this.stats.draining = this.#draining.size;
    });
  }

  /** Requests in flight through a replica in rotation (0 when unknown). */
  activeConnections(id: string): number {
    const h = this.map.get(id);
    return h ? this.#o.replicas.inFlight(h.upstream) : 0;
  }

  /** Every tunnel closed at once, for good. */
  closeAll(): void {
    for (const h of this.map.values()) h.tunnel?.close();
    this.map.clear();
  }

  /** The drains under way (they end at once when the replicas' connections are destroyed). */
  drained(): Promise<unknown> {
    return Promise.all(this.#draining);
  }

  #make(d: DesiredReplica, ctx: LoopContext): Held {
    const t = d.target;
    if (d.problem !== null) {
      const state: TunnelState = { ready: false, reason: 'InvalidConfig', message: d.problem };
      return {
        desired: d,
        tunnel: null,
        state: () => state,
        upstream: { isReady: () => false, open: () => Promise.reject(new Error(d.problem ?? '')) },
      };
    }
    if (t.kind === 'direct') {
      const state: TunnelState = { ready: true, reason: 'Connected', message: `direct ${describeTarget(t)}` };
      return {
        desired: d,
        tunnel: null,
        state: () => state,
        upstream: { isReady: () => true, open: () => openTcp(t.host, t.port, this.#o.connectTimeoutMs) },
      };
    }
    const o = this.#o;
    const tunnel = new ReplicaTunnel({
      target: t,
      chains: o.chains,
      hostKeyScope: { policy: t.hostKeyPolicy ?? 'tofu', replicaId: d.id },
      clock: o.clock,
      random: o.random,
      reconnect: o.reconnect,
      probeIntervalMs: o.probeIntervalMs,
      channelOpenTimeoutMs: o.channelOpenTimeoutMs,
      onState: (s) => {
        this.#report(d, s);
        ctx.logger.info({ replica: d.id, service: d.serviceKey, reason: s.reason, ready: s.ready }, s.message);
      },
      onConnected: () => {
        this.#connects.set(d.id, (this.#connects.get(d.id) ?? 0) + 1);
        this.#report(d, tunnel.state);
      },
    });
    return { desired: d, tunnel, upstream: tunnel, state: () => tunnel.state };
  }

  /** What a tunnel reports about itself: its Ready condition and its reconnects. */
  #report(d: DesiredReplica, s: TunnelState, status: StatusWriter | undefined = this.#o.status()): void {
    if (this.map.get(d.id)?.desired !== d) return; // replaced or removed meanwhile
    if (status === undefined) return; // not started by a controller, or closed
    const key = replicaObjectKey(d.serviceKey, d.id);
    status.set(key, { type: 'Ready', status: s.ready ? 'True' : 'False', reason: s.reason, message: s.message });
    status.setOutputs(key, { reconnects: this.reconnects(d.id) } satisfies ReplicaTunnelOutputs);
  }
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
