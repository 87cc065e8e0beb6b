// The SSH loop's actions applied, in the order that keeps every request served: removed
// services retire first (socket and replicas keep serving while the router may still send
// them requests), then replicas change in memory at once (a socket that starts listening
// already has its replicas in rotation), then sockets close and open.

import type { Balancer, Replicas } from '../../dataplane/index.js';
import { replicaObjectKey, type ServiceSocketOutputs } from '../outputs.js';
import type { Action, BatchOutcome, LoopContext } from '../types.js';
import type { HeldReplicas } from './held-replicas.js';
import type { HostKeyBook } from './host-keys.js';
import type { PlanIndex } from './plan-index.js';
import type { Retiring, SshPayload } from './plan.js';

export interface SshApplierOptions {
  balancer: Balancer;
  replicas: Replicas;
  held: HeldReplicas;
  hostKeys: HostKeyBook;
  index: PlanIndex;
  retiring: Map<string, Retiring>;
  /** Whether a removed service retires until the router has dropped it (else it closes at once). */
  routed: boolean;
  drainMs: number;
  /** How long a retired service's socket stays once the router caught up (old workers finishing). */
  graceMs: number;
}

export class SshApplier {
  readonly #o: SshApplierOptions;

  constructor(o: SshApplierOptions) {
    this.#o = o;
  }

  async apply(actions: Action<SshPayload>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>> {
    const outcomes = new Map<string, BatchOutcome>();
    const unlisten = this.#retireAndRestore(actions, ctx, outcomes);
    const listen = this.#replicasAndOptions(actions, ctx, outcomes, unlisten);
    // Replicas that left (no longer held) leave no trust behind; before any await, so no
    // handshake of a tunnel started above is judged by a departed replica's keys.
    this.#o.hostKeys.retain(this.#o.held.map);
    await this.#sockets(listen, unlisten, ctx, outcomes);
    this.#o.hostKeys.retain(this.#o.held.map); // and those of services closed above
    return outcomes;
  }

  /**
   * Removed services retire: socket and replicas keep serving while the router may still send
   * them requests (it is told in the same round, after this pass). Returns the retired services
   * whose socket may close now.
   */
  #retireAndRestore(actions: Action<SshPayload>[], ctx: LoopContext, outcomes: Map<string, BatchOutcome>): string[] {
    const { retiring, index, replicas, drainMs, graceMs } = this.#o;
    const unlisten: string[] = [];
    const now = ctx.clock.now();
    for (const action of actions) {
      const p = action.payload;
      if (p.what === 'restore') {
        retiring.delete(p.serviceKey);
        index.touch(p.serviceKey);
        replicas.clearLeft(p.serviceKey);
        outcomes.set(action.key, 'done');
      } else if (p.what === 'service' && action.kind === 'delete' && this.#o.routed) {
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
    return unlisten;
  }

  /**
   * Replicas, read timeouts and by-host routes, in memory and at once; those of a retiring
   * service stay until it closes. Returns the services whose socket is to listen.
   */
  #replicasAndOptions(actions: Action<SshPayload>[], ctx: LoopContext, outcomes: Map<string, BatchOutcome>, unlisten: string[]): string[] {
    const { retiring, index, replicas, held } = this.#o;
    const listen: string[] = [];
    for (const action of actions) {
      const p = action.payload;
      if (p.what === 'host') {
        replicas.setHostRoute(p.serviceKey, p.route);
        index.touch(p.serviceKey);
        outcomes.set(action.key, 'done');
      } else if (p.what === 'options') {
        replicas.setServiceOptions(p.serviceKey, p.readTimeoutMs === null ? {} : { readTimeoutMs: p.readTimeoutMs });
        index.touch(p.serviceKey);
        outcomes.set(action.key, 'done');
      } else if (p.what === 'service') {
        if (action.kind !== 'delete') listen.push(p.serviceKey);
        else if (!this.#o.routed) unlisten.push(p.serviceKey);
      } else if (p.what === 'replica') {
        try {
          const id = action.key.slice('replica:'.length);
          const r = p.previous ? retiring.get(p.previous.serviceKey) : undefined;
          if (p.replica === null && r?.replicas.has(id)) {
            outcomes.set(action.key, 'done'); // closes with its service
            continue;
          }
          const current = held.map.get(id);
          const prev = p.previous ?? (current ? { serviceKey: current.desired.serviceKey } : null);
          if (prev) {
            retiring.get(prev.serviceKey)?.replicas.delete(id);
            held.drop(id, prev.serviceKey);
            ctx.status.delete(replicaObjectKey(prev.serviceKey, id));
          }
          if (p.replica) held.hold(p.replica, ctx);
          outcomes.set(action.key, 'done');
        } catch (error) {
          outcomes.set(action.key, { error });
        }
      }
    }
    return listen;
  }

  /**
   * Sockets: closed ones (at once; their open connections drain in the background), then new
   * ones bound several at a time (1,000s on a cold start).
   */
  async #sockets(listen: string[], unlisten: string[], ctx: LoopContext, outcomes: Map<string, BatchOutcome>): Promise<void> {
    const { balancer, index } = this.#o;
    await Promise.all(
      unlisten.map((sk) =>
        this.closeService(sk, ctx).then(
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
      ctx.status.setOutputs(sk, { socketPath: balancer.socketPathFor(sk) } satisfies ServiceSocketOutputs);
      outcomes.set(`service:${sk}`, 'done');
    }
  }

  /** Nothing routes to a retired service any more: its replicas leave, its socket closes. */
  async closeService(sk: string, ctx: LoopContext): Promise<void> {
    const { retiring, index, replicas, held, balancer } = this.#o;
    const r = retiring.get(sk);
    retiring.delete(sk);
    index.touch(sk);
    replicas.clearLeft(sk);
    for (const id of r?.replicas ?? []) {
      if (held.map.get(id)?.desired.serviceKey !== sk) continue; // reused by another service meanwhile
      held.drop(id, sk);
      ctx.status.delete(replicaObjectKey(sk, id));
    }
    await balancer.unlisten(sk);
    index.touch(sk);
    ctx.status.setOutputs(sk, undefined);
  }
}
