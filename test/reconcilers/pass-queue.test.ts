// PassQueue on its own: one pass at a time, triggers during a pass coalesce into one more,
// a pass that claims the triggers covers them, and stop() releases whoever waits.

import { describe, expect, it } from 'vitest';
import { PassQueue } from '../../src/reconcilers/pass-queue.js';
import { deferred } from './fake-loop.js';

/** Each pass waits on its own gate; with `claim`, it claims the triggers when let through. */
function queue(opts: { claim?: boolean } = {}) {
  const gates: ReturnType<typeof deferred>[] = [];
  let running = 0;
  let maxRunning = 0;
  let ended = 0;
  const q: PassQueue = new PassQueue(
    async () => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      const gate = deferred();
      gates.push(gate);
      await gate.promise;
      const covered = opts.claim ? q.claim() : null;
      running--;
      covered?.resolve();
    },
    () => ended++,
  );
  return {
    q,
    gates,
    passes: () => gates.length,
    maxRunning: () => maxRunning,
    ended: () => ended,
  };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('PassQueue', () => {
  it('runs one pass at a time; triggers during a pass coalesce into exactly one more', async () => {
    const t = queue();
    let firstDone = false;
    const first = t.q.trigger().then(() => (firstDone = true));
    expect(t.passes()).toBe(1);
    expect(t.q.busy).toBe(true);
    const second = t.q.trigger();
    const third = t.q.trigger();
    expect(t.passes()).toBe(1); // still the first pass
    t.gates[0]!.resolve();
    await first;
    expect(firstDone).toBe(true);
    await tick();
    expect(t.passes()).toBe(2); // one more for both triggers
    t.gates[1]!.resolve();
    await Promise.all([second, third]);
    expect(t.maxRunning()).toBe(1);
    expect(t.ended()).toBe(2);
    expect(t.q.busy).toBe(false);
    expect(t.q.inFlight()).toEqual([]);
  });

  it('a pass that claims the triggers so far covers them: no pass follows for them', async () => {
    const t = queue({ claim: true });
    const first = t.q.trigger();
    const during = t.q.trigger(); // before the pass reads its inputs
    t.gates[0]!.resolve();
    await Promise.all([first, during]);
    await tick();
    expect(t.passes()).toBe(1);
    expect(t.q.busy).toBe(false);
  });

  it('stop() lets the running pass end, starts no other, and releases the triggers waiting for one', async () => {
    const t = queue();
    const first = t.q.trigger();
    const waiting = t.q.trigger();
    t.q.stop();
    expect(t.q.running).not.toBeNull();
    t.gates[0]!.resolve();
    await Promise.all([first, waiting]);
    await t.q.trigger(); // resolves at once
    expect(t.passes()).toBe(1);
    expect(t.q.running).toBeNull();
  });
});
