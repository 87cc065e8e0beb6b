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
  /**
   * The objects' entries, by key: also what snapshots hand out, as a live view. Copying it per
   * write would make every change cost the whole loop's object count (a pass of each loop and
   * every listener asks for a snapshot after each write).
   */
  readonly #objects: Record<string, Entry> = Object.create(null) as Record<string, Entry>;
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
    const entry = this.#objects[key];
    const { conditions, changed } = setCondition(entry?.conditions ?? [], cond, this.#now());
    if (!changed) return;
    this.#store(key, frozenEntry(conditions, entry?.outputs));
  }

  setObjectOutputs(key: string, outputs: Outputs | undefined): void {
    const entry = this.#objects[key];
    if (sameOutputs(entry?.outputs, outputs)) return;
    const conditions = entry?.conditions ?? [];
    if (outputs === undefined && conditions.length === 0) this.deleteObject(key);
    else this.#store(key, frozenEntry(conditions, outputs === undefined ? undefined : Object.freeze({ ...outputs })));
  }

  deleteObject(key: string): void {
    if (!(key in this.#objects)) return;
    delete this.#objects[key];
    this.#onChange();
  }

  #store(key: string, entry: Entry): void {
    this.#objects[key] = entry;
    this.#onChange();
  }

  /** A writer for the loop; reads and writes the live store. */
  writer(): StatusWriter {
    return {
      set: (key, cond) => this.setObjectCondition(key, { ...cond, observedGeneration: cond.observedGeneration ?? this.#generation() }),
      setOutputs: (key, outputs) => this.setObjectOutputs(key, outputs),
      delete: (key) => this.deleteObject(key),
      prune: (keep) => {
        const keepSet = new Set(keep);
        for (const key of Object.keys(this.#objects)) if (!keepSet.has(key)) this.deleteObject(key);
      },
      // Frozen when stored, conditions and outputs alike: no copy needed.
      get: (key) => this.#objects[key]?.conditions,
      outputs: (key) => this.#objects[key]?.outputs,
      keys: () => Object.keys(this.#objects).sort(),
    };
  }

  /**
   * The loop's conditions and failures as they are now, and its objects as a live, read-only
   * view, in no particular order: every pass of every loop and every status listener asks after
   * each write, and a copy would cost the loop's whole object count each time. An entry is never
   * changed once stored (a write stores a new, frozen one), so an entry read stays as it was;
   * the view itself follows later writes. Whoever shows or keeps it copies it (sortedObjects).
   */
  snapshot(failures: Record<string, FailureInfo>): LoopStatus {
    return {
      conditions: [...this.#conditions],
      objects: this.#objects as Readonly<Record<string, ObjectStatus>>,
      failures: structuredClone(failures),
    };
  }
}

/** A copy of a snapshot's objects, sorted by key: for answers and anything kept past the moment. */
export function sortedObjects(objects: Readonly<Record<string, ObjectStatus>>): Record<string, ObjectStatus> {
  const out: Record<string, ObjectStatus> = {};
  for (const key of Object.keys(objects).sort()) out[key] = objects[key]!;
  return out;
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
