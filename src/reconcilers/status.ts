// One loop's status: loop-level conditions, and per object its conditions and outputs, written
// only when they differ. The controller owns one store per loop and hands loops a StatusWriter
// over it.

import { setCondition, type Condition, type ConditionInput } from './conditions.js';
import type { FailureInfo, LoopStatus, ObjectStatus, Outputs, StatusWriter } from './types.js';

interface Entry {
  conditions: readonly Condition[];
  outputs?: Outputs;
}

export class StatusStore {
  #conditions: readonly Condition[] = [];
  #objects = new Map<string, Entry>();
  readonly #now: () => number;
  readonly #generation: () => number;
  readonly #onChange: () => void;
  /** The copy snapshot() last made, until the next write: a pass and every listener share it. */
  #copy: Pick<LoopStatus, 'conditions' | 'objects'> | null = null;

  /**
   * `generation` gives the observedGeneration to stamp when a writer gives none; `onChange`
   * is called after every write that changed something.
   */
  constructor(opts: { now: () => number; generation: () => number; onChange: () => void }) {
    this.#now = opts.now;
    this.#generation = opts.generation;
    this.#onChange = () => {
      this.#copy = null;
      opts.onChange();
    };
  }

  setLoopCondition(cond: ConditionInput): void {
    const { conditions, changed } = setCondition(this.#conditions, cond, this.#now());
    if (!changed) return;
    this.#conditions = conditions;
    this.#onChange();
  }

  setObjectCondition(key: string, cond: ConditionInput): void {
    const entry = this.#objects.get(key);
    const { conditions, changed } = setCondition(entry?.conditions ?? [], cond, this.#now());
    if (!changed) return;
    this.#objects.set(key, frozenEntry(conditions, entry?.outputs));
    this.#onChange();
  }

  setObjectOutputs(key: string, outputs: Outputs | undefined): void {
    const entry = this.#objects.get(key);
    if (sameOutputs(entry?.outputs, outputs)) return;
    const conditions = entry?.conditions ?? [];
    if (outputs === undefined && conditions.length === 0) this.#objects.delete(key);
    else this.#objects.set(key, frozenEntry(conditions, outputs === undefined ? undefined : Object.freeze({ ...outputs })));
    this.#onChange();
  }

  deleteObject(key: string): void {
    if (this.#objects.delete(key)) this.#onChange();
  }

  /** A writer for the loop; reads and writes the live store. */
  writer(): StatusWriter {
    return {
      set: (key, cond) => this.setObjectCondition(key, { ...cond, observedGeneration: cond.observedGeneration ?? this.#generation() }),
      setOutputs: (key, outputs) => this.setObjectOutputs(key, outputs),
      delete: (key) => this.deleteObject(key),
      prune: (keep) => {
        const keepSet = new Set(keep);
        for (const key of [...this.#objects.keys()]) if (!keepSet.has(key)) this.deleteObject(key);
      },
      // Frozen when stored, conditions and outputs alike: no copy needed.
      get: (key) => this.#objects.get(key)?.conditions,
      outputs: (key) => this.#objects.get(key)?.outputs,
      keys: () => [...this.#objects.keys()].sort(),
    };
  }

  /**
   * Every object's status, sorted by key. Every pass of every loop and every status listener
   * asks, so the copy is shallow and made once per write: the entries it shares are never
   * changed once stored (a write stores a new, frozen entry), and the map is frozen too.
   */
  snapshot(failures: Record<string, FailureInfo>): LoopStatus {
    if (this.#copy === null) {
      const keys = [...this.#objects.keys()].sort();
      const objects: Record<string, ObjectStatus> = {};
      for (const k of keys) objects[k] = this.#objects.get(k)! as ObjectStatus;
      this.#copy = { conditions: [...this.#conditions], objects: Object.freeze(objects) };
    }
    return { conditions: [...this.#copy.conditions], objects: this.#copy.objects, failures: structuredClone(failures) };
  }
}

/** Stored entries are shared by every snapshot: never changed, replaced on a write. */
function frozenEntry(conditions: readonly Condition[], outputs: Outputs | undefined): Entry {
  for (const c of conditions) Object.freeze(c);
  Object.freeze(conditions);
  return Object.freeze(outputs === undefined ? { conditions } : { conditions, outputs });
}

function sameOutputs(a: Outputs | undefined, b: Outputs | undefined): boolean {
  if (a === b) return true;
  if (a === undefined || b === undefined) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.is(a[k], b[k]));
}

/** A writer that reads the live store and drops writes: for dry runs. */
export function readOnlyWriter(inner: StatusWriter): StatusWriter {
  return {
    set: () => {},
    setOutputs: () => {},
    delete: () => {},
    prune: () => {},
    get: inner.get,
    outputs: inner.outputs,
    keys: inner.keys,
  };
}

/**
 * A loop's status store and when its changes go out. Writes during a pass are held back and
 * go out once, when the pass has settled (a dependent triggered earlier would read half a
 * pass); writes between passes (a tunnel that drops) go out once the code that made them
 * yields (a microtask later), so a burst of them is one change.
 */
export class StatusFeed {
  readonly store: StatusStore;
  readonly #publish: () => void;
  #held = false;
  #dirty = false;
  #scheduled = false;

  /** `publish` sends the current status to listeners and the loops it triggers. */
  constructor(opts: { now: () => number; generation: () => number; publish: () => void }) {
    this.#publish = opts.publish;
    this.store = new StatusStore({ now: opts.now, generation: opts.generation, onChange: () => this.#changed() });
  }

  /** A pass begins: hold changes back. */
  hold(): void {
    this.#held = true;
  }

  /** The pass has settled: send what it changed. */
  release(): void {
    this.#held = false;
    this.flush();
  }

  /** Sends pending changes now, if there are any. */
  flush(): void {
    if (!this.#dirty) return;
    this.#dirty = false;
    this.#publish();
  }

  #changed(): void {
    this.#dirty = true;
    if (this.#held || this.#scheduled) return;
    this.#scheduled = true;
    queueMicrotask(() => {
      this.#scheduled = false;
      if (!this.#held) this.flush();
    });
  }
}
