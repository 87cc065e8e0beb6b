// The copy a --db gateway keeps of its last document: started while the database does not
// answer it serves the copy and takes no change; once the database opens (retried on the
// clock) its document takes over and watchers hear of it; a database behind the copy is not
// served; without a copy the start fails as before. The database is a scripted store.

import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/errors.js';
import { openCachedStore } from '../../src/state/cached-store.js';
import type { StoredState } from '../../src/state/store.js';
import type { ChangeListener, WatchedStateStore } from '../../src/state/watched-store.js';
import { API_VERSION, KIND, validate } from '../../src/spec/index.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { tmpDir } from '../helpers/tmp.js';

const tmp = tmpDir('dp-cached-store-');
afterAll(() => tmp.cleanup());
let n = 0;

function stored(generation: number, run: string): StoredState {
  const v = validate({
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { projects: [{ name: 'main' }], services: [{ project: 'main', run, replicas: [] }] },
  });
  if (!v.ok) throw new Error(JSON.stringify(v.errors));
  return { generation, hash: `h${generation}`, state: v.state, updatedAt: '' };
}

/** A database store holding `doc`; push() makes it report a new one. */
function database(doc: StoredState): WatchedStateStore & { push(s: StoredState): void } {
  let current = doc;
  const listeners = new Set<ChangeListener>();
  return {
    kind: 'postgres',
    read: async () => current,
    write: async () => ({ changed: true, generation: current.generation + 1, hash: 'x' }) as never,
    close: async () => undefined,
    watch(l) {
      listeners.add(l);
      return () => listeners.delete(l);
    },
    health: () => ({
      kind: 'postgres',
      generation: current.generation,
      storedGeneration: current.generation,
      connected: true,
      lastError: undefined,
    }),
    push(s) {
      current = s;
      for (const l of listeners) l(s);
    },
  };
}

const down = (): Promise<never> => Promise.reject(new ProxyError('DP_ERR_STATE_UNAVAILABLE', 'connect ECONNREFUSED'));
const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('openCachedStore', () => {
  it('copies what the database serves (0600), and fails to start without a database or a copy', async () => {
    const file = join(tmp.dir, `copy-${++n}.json`);
    const db = database(stored(3, 'a'));
    const store = await openCachedStore({ open: async () => db, cacheFile: file });
    expect((await store.read()).generation).toBe(3);
    for (let i = 0; i < 100 && !existsSync(file); i++) await new Promise((r) => setTimeout(r, 10));
    expect(JSON.parse(readFileSync(file, 'utf8'))).toMatchObject({ generation: 3 });
    expect(statSync(file).mode & 0o777).toBe(0o600);
    await store.close();
    await expect(openCachedStore({ open: down, cacheFile: join(tmp.dir, 'none.json') })).rejects.toThrow(/ECONNREFUSED/);
  });

  it('starts from the copy while the database is down, refuses writes, and takes the database once it opens', async () => {
    const file = join(tmp.dir, `copy-${++n}.json`);
    writeFileSync(file, JSON.stringify(stored(5, 'copied')));
    const clock = new FakeClock(Date.now());
    let db: ReturnType<typeof database> | undefined;
    const store = await openCachedStore({ open: async () => db ?? down(), cacheFile: file, clock });
    const seen: number[] = [];
    store.watch((s) => seen.push(s.generation));
    expect((await store.read()).generation).toBe(5);
    expect(store.health().connected).toBe(false);
    await expect(store.write(stored(6, 'x').state)).rejects.toMatchObject({ code: 'DP_ERR_STATE_UNAVAILABLE' });
    db = database(stored(7, 'newer'));
    clock.advance(2_000);
    for (let i = 0; i < 5; i++) await tick();
    expect(seen).toEqual([7]);
    expect((await store.read()).generation).toBe(7);
    db.push(stored(8, 'later'));
    expect(seen).toEqual([7, 8]);
    await store.close();
  });

  it('keeps the copy when the database is behind it, and says so', async () => {
    const file = join(tmp.dir, `copy-${++n}.json`);
    writeFileSync(file, JSON.stringify(stored(9, 'copied')));
    const clock = new FakeClock(Date.now());
    let db: ReturnType<typeof database> | undefined;
    const store = await openCachedStore({ open: async () => db ?? down(), cacheFile: file, clock });
    db = database(stored(4, 'old-backup'));
    clock.advance(2_000);
    for (let i = 0; i < 5; i++) await tick();
    expect((await store.read()).generation).toBe(9);
    expect(store.health().lastError?.message).toMatch(/generation 4, behind the 9/);
    await store.close();
  });

  it('treats a damaged copy as none', async () => {
    const file = join(tmp.dir, `copy-${++n}.json`);
    writeFileSync(file, '{"generation": 2, "hash": "x", "state": {"kind": "nope"}}');
    await expect(openCachedStore({ open: down, cacheFile: file })).rejects.toThrow(/ECONNREFUSED/);
  });
});
