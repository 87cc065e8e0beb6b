// When each model first appeared in the document: the `created` of GET /models. Kept across
// restarts and re-PUTs. The gateway keeps it in a small JSON file in its state dir (0600, atomic
// temp + rename); the in-server proxy can keep it in its database behind the same interface.

import { readFile } from 'node:fs/promises';
import { writeAtomic } from '../write-atomic.js';

export interface FirstSeenStore {
  /**
   * Records `nowSec` for every key of `present` not seen yet, forgets keys no longer present
   * (a model removed and added back is new), and returns the time of every present key.
   */
  sync(present: readonly string[], nowSec: number): Promise<Map<string, number>>;
}

/** `<project>/<model name>`: the key of a model in a FirstSeenStore. */
export function modelKey(project: string, name: string): string {
  return `${project}/${name}`;
}

export function memoryFirstSeenStore(initial: Record<string, number> = {}): FirstSeenStore {
  const seen = new Map(Object.entries(initial));
  return {
    async sync(present, nowSec) {
      return syncMap(seen, present, nowSec).times;
    },
  };
}

function syncMap(seen: Map<string, number>, present: readonly string[], nowSec: number): { times: Map<string, number>; changed: boolean } {
  let changed = false;
  const keep = new Set(present);
  for (const k of [...seen.keys()]) {
    if (!keep.has(k)) {
      seen.delete(k);
      changed = true;
    }
  }
  const times = new Map<string, number>();
  for (const k of keep) {
    let t = seen.get(k);
    if (t === undefined) {
      t = nowSec;
      seen.set(k, t);
      changed = true;
    }
    times.set(k, t);
  }
  return { times, changed };
}

/** A store in `path` (e.g. `<stateDir>/models.json`): `{"version":1,"firstSeen":{"<key>":<unix s>}}`. */
export function fileFirstSeenStore(path: string): FirstSeenStore {
  let loaded: Promise<Map<string, number>> | undefined;
  /** Writes run one after another so an older map never lands after a newer one. */
  let writing: Promise<void> = Promise.resolve();

  async function load(): Promise<Map<string, number>> {
    try {
      const doc: unknown = JSON.parse(await readFile(path, 'utf8'));
      const fs = typeof doc === 'object' && doc !== null ? (doc as { firstSeen?: unknown }).firstSeen : undefined;
      const out = new Map<string, number>();
      if (typeof fs === 'object' && fs !== null) {
        for (const [k, v] of Object.entries(fs)) if (typeof v === 'number' && Number.isFinite(v)) out.set(k, v);
      }
      return out;
    } catch (err) {
      // Missing or corrupt: start afresh (the next change rewrites the file).
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' || err instanceof SyntaxError) return new Map();
      loaded = undefined;
      throw err;
    }
  }

  async function save(seen: Map<string, number>): Promise<void> {
    const text = `${JSON.stringify({ version: 1, firstSeen: Object.fromEntries([...seen].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) }, null, 2)}\n`;
    await writeAtomic(path, text, { mode: 0o600, makeDir: true });
  }

  return {
    async sync(present, nowSec) {
      loaded ??= load();
      const seen = await loaded;
      const { times, changed } = syncMap(seen, present, nowSec);
      if (changed) {
        const snapshot = new Map(seen);
        writing = writing.catch(() => undefined).then(() => save(snapshot));
        await writing;
      }
      return times;
    },
  };
}
