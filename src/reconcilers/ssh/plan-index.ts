// What the SSH loop's plan reads of the replicas it holds, kept up to date service by service
// as the loop changes them instead of rebuilt on every pass.

import type { HeldReplica, KeySet, Retiring, ServiceFacts } from './plan.js';
import type { DesiredReplica } from './targets.js';

/** Where the facts the plan compares live, each kept by its owner and read live. */
export interface IndexSources {
  heldReplicas: ReadonlyMap<string, { readonly desired: DesiredReplica }>;
  retiring: ReadonlyMap<string, Retiring>;
  listening: KeySet;
  readTimeouts: ReadonlyMap<string, number>;
  hostRoutes: ReadonlyMap<string, unknown>;
}

/**
 * The held replicas as the plan reads them (held, except those of a retiring service: they
 * close with it), by id and by service, and per service its facts (ServiceFacts), a new object
 * whenever anything the plan compares about it changes: its replicas held or dropped, its
 * socket opened or closed, retired or restored, its read timeout or by-host route set. Writers
 * mark the services they change (touch); observe() brings those services up to date (refresh).
 */
export class PlanIndex {
  readonly replicas = new Map<string, HeldReplica>();
  readonly byService = new Map<string, Set<string>>();
  readonly facts = new Map<string, ServiceFacts>();
  /** Every held replica id by the service it is held under, retiring ones included. */
  readonly #heldBy = new Map<string, Set<string>>();
  readonly #dirty = new Set<string>();

  constructor(private readonly sources: IndexSources) {}

  held(sk: string, id: string): void {
    let ids = this.#heldBy.get(sk);
    if (ids === undefined) this.#heldBy.set(sk, (ids = new Set()));
    ids.add(id);
    this.touch(sk);
  }

  dropped(sk: string, id: string): void {
    const ids = this.#heldBy.get(sk);
    if (ids?.delete(id) && ids.size === 0) this.#heldBy.delete(sk);
    this.touch(sk);
  }

  /** A copy of the ids held under `sk`, retiring ones included. */
  heldUnder(sk: string): Set<string> {
    return new Set(this.#heldBy.get(sk));
  }

  touch(sk: string): void {
    this.#dirty.add(sk);
  }

  refresh(): void {
    for (const sk of this.#dirty) {
      const before = this.byService.get(sk);
      for (const id of before ?? []) if (this.replicas.get(id)?.serviceKey === sk) this.replicas.delete(id);
      const { heldReplicas, retiring, listening, readTimeouts, hostRoutes } = this.sources;
      const leaving = retiring.get(sk)?.replicas;
      const ids = new Set<string>();
      for (const id of this.#heldBy.get(sk) ?? []) {
        const h = heldReplicas.get(id);
        if (h === undefined || h.desired.serviceKey !== sk || leaving?.has(id)) continue;
        ids.add(id);
        this.replicas.set(id, h.desired);
      }
      if (ids.size > 0) this.byService.set(sk, ids);
      else this.byService.delete(sk);
      const facts: ServiceFacts = Object.freeze({
        listening: listening.has(sk),
        held: ids.size,
        readTimeout: readTimeouts.has(sk),
        hostRoute: hostRoutes.has(sk),
      });
      if (facts.listening || facts.held > 0 || facts.readTimeout || facts.hostRoute || retiring.has(sk)) this.facts.set(sk, facts);
      else this.facts.delete(sk);
    }
    this.#dirty.clear();
  }

  clear(): void {
    this.replicas.clear();
    this.byService.clear();
    this.facts.clear();
    this.#heldBy.clear();
    this.#dirty.clear();
  }
}
