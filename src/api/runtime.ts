// What the HTTP API needs from the process behind it (the gateway daemon, or the in-server
// proxy): the state store, a dry-run planner, a trigger, and status. buildApp takes this, so
// tests can build the API over a real store and real loops without listening.

import type { SpecDiff } from '../spec/index.js';
import type { ProxyState } from '../spec/index.js';
import type { StateStore } from '../state/store.js';
import type { StatusSnapshot } from '../reconcilers/types.js';

export interface PlannedAction {
  key: string;
  kind: string;
  summary: string;
  /** Unified diff (Nginx files). */
  diff?: string;
}

export interface LoopPlan {
  actions: PlannedAction[];
  /** Loop-specific facts, e.g. `{reload: true}` for Nginx. */
  notes?: Record<string, unknown>;
}

export interface Plan {
  /** Object-level changes of the document; secrets only as '<redacted>'. */
  document: SpecDiff;
  /** Per loop, its actions: a dry run's. Empty in the answer of a PUT that applies. */
  loops: Record<string, LoopPlan>;
}

export interface Runtime {
  store: StateStore;
  /** A dry run: what every loop would do to reach `next`. Pure of side effects. */
  plan(next: ProxyState, current: ProxyState): Promise<Plan>;
  /** A new generation was stored: converge to it. */
  notify(): void;
  status(): StatusSnapshot;
  /** True once the first reconcile pass finished. */
  isReady(): boolean;
}
