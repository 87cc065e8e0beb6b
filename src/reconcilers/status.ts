// One loop's status: loop-level conditions and per-object conditions, written only when they
// differ. The controller owns one store per loop and hands loops a StatusWriter over it.

import { setCondition, type Condition, type ConditionInput } from './conditions.js';
import type { FailureInfo, LoopStatus, StatusWriter } from './types.js';

export class StatusStore {
  #conditions: readonly Condition[] = [];
  #objects = new Map<string, readonly Condition[]>();
  readonly #now: () => number;
  readonly #generation: () => number;
  readonly #onChange: () => void;

  /**
   * `generation` gives the observedGeneration to stamp when a writer gives none; `onChange`
   * is called after every write that changed something.
   */
  constructor(opts: { now: () => number; generation: () => number; onChange: () => void }) {
    this.#now = opts.now;
    this.#generation = opts.generation;
    this.#onChange = opts.onChange;
  }

  setLoopCondition(cond: ConditionInput): void {
    const { conditions, changed } = setCondition(this.#conditions, cond, this.#now());
    if (!changed) return;
    this.#conditions = conditions;
    this.#onChange();
  }

  setObjectCondition(key: string, cond: ConditionInput): void {
    const { conditions, changed } = setCondition(this.#objects.get(key) ?? [], cond, this.#now());
    if (!changed) return;
    this.#objects.set(key, conditions);
    this.#onChange();
  }

  deleteObject(key: string): void {
    if (this.#objects.delete(key)) this.#onChange();
  }

  /** A writer for the loop; reads and writes the live store. */
  writer(): StatusWriter {
    return {
      set: (key, cond) => this.setObjectCondition(key, { ...cond, observedGeneration: cond.observedGeneration ?? this.#generation() }),
      delete: (key) => this.deleteObject(key),
      prune: (keep) => {
        const keepSet = new Set(keep);
        for (const key of [...this.#objects.keys()]) if (!keepSet.has(key)) this.deleteObject(key);
      },
      get: (key) => {
        const c = this.#objects.get(key);
        return c === undefined ? undefined : structuredClone(c);
      },
      keys: () => [...this.#objects.keys()].sort(),
    };
  }

  /** A deep copy, objects sorted by key. */
  snapshot(failures: Record<string, FailureInfo>): LoopStatus {
    const keys = [...this.#objects.keys()].sort();
    return structuredClone({
      conditions: [...this.#conditions],
      objects: Object.fromEntries(keys.map((k) => [k, [...(this.#objects.get(k) ?? [])]])),
      failures,
    });
  }
}

/** A writer that reads the live store and drops writes: for dry runs. */
export function readOnlyWriter(inner: StatusWriter): StatusWriter {
  return { set: () => {}, delete: () => {}, prune: () => {}, get: inner.get, keys: inner.keys };
}
