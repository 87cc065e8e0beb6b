// How far one loop has got through the generations: the pass gate that orders dependents
// after their dependencies reads this, and the top-level observedGeneration is its minimum.

import { deferred, type Deferred } from './pass-queue.js';

export class Settling {
  /** Generation read by the pass running or last run (status writes default to it). */
  generation = 0;
  /** Generation read by the last pass that settled (failed or not); -1 before the first. */
  settledGeneration = -1;
  /** Generation read by the last pass that settled without failing as a whole; -1 before the first. */
  observedGeneration = -1;
  #settledThisPass = false;
  #signal: Deferred = deferred();

  /** A pass begins: it has not settled yet. */
  begin(): void {
    this.#settledThisPass = false;
  }

  /**
   * The running pass has settled after reading `generation`: dependents may run on its status
   * from now on. Returns false when it had already settled (a loop that settles after planning
   * settles once, before its actions).
   */
  settle(generation: number, observed: boolean): boolean {
    if (this.#settledThisPass) return false;
    this.#settledThisPass = true;
    this.settledGeneration = Math.max(this.settledGeneration, generation);
    if (observed) this.observedGeneration = Math.max(this.observedGeneration, generation);
    this.wake();
    return true;
  }

  /** Resolves at the next settle() or wake(). */
  changed(): Promise<void> {
    return this.#signal.promise;
  }

  /** Wakes whoever waits in changed() (a pass ended, or the controller stops). */
  wake(): void {
    const s = this.#signal;
    this.#signal = deferred();
    s.resolve();
  }
}

interface Settler {
  settling: Settling;
  passes: { readonly busy: boolean };
}

/**
 * Resolves once every one of `deps` has settled a pass that read `generation` or a later one,
 * or has no pass running or asked for, or `stopped()`. Passes a dependency queues after that
 * one (its own requeues, every few seconds for a TLS loop waiting on DNS) are not waited for.
 */
export async function settledAll(deps: readonly Settler[], generation: number, stopped: () => boolean): Promise<void> {
  for (;;) {
    if (stopped()) return;
    const waiting = deps.filter((d) => d.settling.settledGeneration < generation && d.passes.busy);
    if (waiting.length === 0) return;
    await Promise.race(waiting.map((d) => d.settling.changed()));
  }
}
