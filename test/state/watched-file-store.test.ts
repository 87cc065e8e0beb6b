// The state.json store's watch poll runs on the injected clock: a change made behind its back
// (another instance writing the same directory) shows once the clock has moved by pollMs.

import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadDocument } from '../../src/spec/index.js';
import { openWatchedFileStore } from '../../src/state/watched-file-store.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { tmpDir } from '../helpers/tmp.js';
import { turns, turnsUntil } from './turns.js';

const docA = loadDocument(readFileSync('examples/local-state.yaml', 'utf8'));

describe('watched state.json store', () => {
  let t: ReturnType<typeof tmpDir>;
  let stateDir: string;
  beforeEach(() => {
    t = tmpDir();
    stateDir = path.join(t.dir, 'state');
  });
  afterEach(() => t.cleanup());

  it('stats state.json on its clock while watched, and picks up a change made behind its back after pollMs', async () => {
    const clock = new FakeClock();
    const store = await openWatchedFileStore({ stateDir, pollMs: 60_000, clock });
    expect(clock.pendingTimers()).toBe(0); // nobody watches yet
    const seen: number[] = [];
    const stop = store.watch((s) => seen.push(s.generation));
    expect(clock.pendingTimers()).toBe(1);

    const other = await openWatchedFileStore({ stateDir });
    await other.write(docA);
    await other.close();
    clock.advance(59_999);
    await turns();
    expect(seen).toEqual([]);

    clock.advance(1);
    await turnsUntil(() => seen.length > 0, 'the poll picks up the new state.json');
    expect(seen).toEqual([1]);
    expect(store.health()).toMatchObject({ generation: 1, lastError: undefined });

    stop();
    expect(clock.pendingTimers()).toBe(0);
    store.watch(() => undefined);
    expect(clock.pendingTimers()).toBe(1);
    await store.close();
    expect(clock.pendingTimers()).toBe(0);
  });
});
