// What the HTTP API needs from the process behind it (the gateway daemon, or the in-server
// proxy): the state store, a dry-run planner, and status. buildApp takes this, so tests can
// build the API over a real store and real loops without listening. No trigger: the daemon
// watches its store, and a write through it is reported by that watch.

import type { SpecDiff } from '../spec/index.js';
import type { ProxyState } from '../spec/index.js';
import type { WatchedStateStore } from '../state/watched-store.js';
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
  /** Watched: a write through it reaches the loops by the same watch as an edit from outside. */
  store: WatchedStateStore;
  /** A dry run: what every loop would do to reach `next`. Pure of side effects. */
  plan(next: ProxyState, current: ProxyState): Promise<Plan>;
  status(): StatusSnapshot;
  /** True once the first reconcile pass finished. */
  isReady(): boolean;
}
