// The loop lifecycle under the controller: start before the first pass in dependency order,
// close after stop in reverse order, and a handle that lets background work report and ask
// for passes.

import { afterEach, describe, expect, it } from 'vitest';
import { FakeClock } from '../helpers/fake-clock.js';
import { Controller } from '../../src/reconcilers/controller.js';
import type { AnyLoop, LoopHandle, LoopStatus } from '../../src/reconcilers/types.js';
import { deferred, fakeLoop, specWith, until, type FakeLoop, type Spec } from './fake-loop.js';

const controllers: Controller[] = [];
afterEach(async () => {
  await Promise.all(controllers.splice(0).map((c) => c.stop()));
});

function setup(loops: AnyLoop[], spec: { current: Spec }) {
  const clock = new FakeClock();
  const c = new Controller({ loops, getSpec: () => spec.current, clock, random: () => 0.5 });
  controllers.push(c);
  return { c, clock };
}

/** A fake loop with start/close that record into `events`. */
function withLifecycle(f: FakeLoop, events: string[], extra: Partial<AnyLoop> = {}): AnyLoop {
  return {
    ...f.loop,
    start: () => {
      events.push(`start:${f.loop.name}`);
    },
    close: async () => {
      events.push(`close:${f.loop.name}`);
    },
    ...extra,
  };
}

describe('loop lifecycle', () => {
  it('starts loops in dependency order before any pass, and closes them in reverse order', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const events: string[] = [];
    const sockets = fakeLoop({ name: 'sockets' });
    const certs = fakeLoop({ name: 'certs', dependsOn: ['sockets'] });
    const sites = fakeLoop({ name: 'sites', dependsOn: ['certs', 'sockets'] });
    const observesAtStart: number[] = [];
    const loops = [sites, certs, sockets].map((f) =>
      withLifecycle(f, events, {
        start: () => {
          events.push(`start:${f.loop.name}`);
          observesAtStart.push(sites.observes + certs.observes + sockets.observes);
        },
      }),
    );
    const { c } = setup(loops, spec);
    await c.start();
    expect(events).toEqual(['start:sockets', 'start:certs', 'start:sites']);
    expect(observesAtStart).toEqual([0, 0, 0]);
    expect([sockets, certs, sites].map((f) => f.observes)).toEqual([1, 1, 1]);
    await c.stop();
    expect(events.slice(3)).toEqual(['close:sites', 'close:certs', 'close:sockets']);
  });

  it('status writes and triggers during start run no pass before every loop has started', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const events: string[] = [];
    const first = fakeLoop({ name: 'first' });
    const second = fakeLoop({ name: 'second', dependsOn: ['first'] });
    const early: AnyLoop = {
      ...first.loop,
      start: (h) => {
        h.status.setOutputs('found-at-start', { n: 1 });
        h.trigger();
      },
    };
    const late: AnyLoop = {
      ...second.loop,
      start: async () => {
        for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
        events.push(`observes when the last loop starts: ${first.observes + second.observes}`);
      },
    };
    const { c } = setup([late, early], spec);
    await c.start();
    await c.whenIdle();
    expect(events).toEqual(['observes when the last loop starts: 0']);
    expect([c.counters().first?.passes, c.counters().second?.passes]).toEqual([1, 1]);
    expect(c.statuses().loops.first?.objects['found-at-start']?.outputs).toEqual({ n: 1 });
  });

  it('closes a loop only after its in-flight actions have finished', async () => {
    const spec = { current: specWith(1, { p: 1 }) };
    const events: string[] = [];
    const hold = deferred();
    const f = fakeLoop({ name: 'held', gate: () => hold.promise });
    const loop = withLifecycle(f, events, {
      close: async () => {
        events.push(`close with p ${f.world.has('p') ? 'applied' : 'missing'}`);
      },
    });
    const { c } = setup([loop], spec);
    const starting = c.start();
    await until(() => f.applied.length === 1);
    const stopping = c.stop();
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    expect(events).toEqual(['start:held']); // p is still in flight: not closed yet
    hold.resolve();
    await stopping;
    await starting;
    expect(events).toEqual(['start:held', 'close with p applied']);
  });

  it('a loop whose start fails fails controller.start(); later loops are not started and no pass runs', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const events: string[] = [];
    const first = fakeLoop({ name: 'first' });
    const second = fakeLoop({ name: 'second', dependsOn: ['first'] });
    const failing = withLifecycle(first, events, {
      start: () => {
        events.push('start:first');
        throw new Error('cannot bind the socket directory');
      },
    });
    const { c } = setup([withLifecycle(second, events), failing], spec);
    await expect(c.start()).rejects.toThrow('cannot bind the socket directory');
    expect(events).toEqual(['start:first']);
    expect(first.observes + second.observes).toBe(0);
    // A new generation arriving after the failed start is no unhandled rejection.
    const unhandled: unknown[] = [];
    const onUnhandled = (err: unknown): void => void unhandled.push(err);
    process.on('unhandledRejection', onUnhandled);
    try {
      c.notify();
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    expect(unhandled).toEqual([]);
  });

  it('closes each loop once, however often stop() is called', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const events: string[] = [];
    const f = fakeLoop({ name: 'only' });
    const { c } = setup([withLifecycle(f, events)], spec);
    await c.start();
    await Promise.all([c.stop(), c.stop()]);
    await c.stop();
    expect(events).toEqual(['start:only', 'close:only']);
  });

  it('handle.trigger() runs one more pass of that loop only', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let handle: LoopHandle | undefined;
    const own = fakeLoop({ name: 'own' });
    const other = fakeLoop({ name: 'other' });
    const loop: AnyLoop = { ...own.loop, start: (h) => void (handle = h) };
    const { c } = setup([loop, other.loop], spec);
    await c.start();
    await c.whenIdle();
    expect([c.counters().own?.passes, c.counters().other?.passes]).toEqual([1, 1]);
    handle!.trigger();
    await c.whenIdle();
    expect([c.counters().own?.passes, c.counters().other?.passes]).toEqual([2, 1]);
  });

  it('status written through the handle between passes reaches listeners and triggers dependents', async () => {
    const spec = { current: specWith(1, {}) };
    let handle: LoopHandle | undefined;
    const tunnels = fakeLoop({ name: 'tunnels' });
    // The dependent routes to every tunnel whose outputs say it is up.
    const routes = fakeLoop({
      name: 'routes',
      dependsOn: ['tunnels'],
      want: (_s, statuses) =>
        new Map(
          Object.entries(statuses.loops.tunnels?.objects ?? {})
            .filter(([, o]) => o.outputs?.up === true)
            .map(([k]) => [`route-${k}`, 'on']),
        ),
    });
    const tunnelLoop: AnyLoop = { ...tunnels.loop, start: (h) => void (handle = h) };
    const { c } = setup([routes.loop, tunnelLoop], spec);
    const seen: LoopStatus[] = [];
    c.onStatus((name, s) => name === 'tunnels' && seen.push(s));
    await c.start();
    await c.whenIdle();
    const passes = c.counters().routes?.passes ?? 0;
    expect(routes.world.size).toBe(0);

    handle!.status.set('r1', { type: 'Ready', status: 'True', reason: 'Connected', message: 'connected' });
    handle!.status.setOutputs('r1', { up: true });
    await c.whenIdle();
    expect(handle!.status.outputs('r1')).toEqual({ up: true });
    expect(c.statuses().loops.tunnels?.objects.r1?.outputs).toEqual({ up: true });
    expect(seen.at(-1)?.objects.r1?.outputs).toEqual({ up: true });
    expect([...routes.world.keys()]).toEqual(['route-r1']);
    // Both writes of one tick went out as one change: one pass of the dependent applied them.
    expect(c.counters().routes?.passes).toBe(passes + 1);
    expect(c.counters().tunnels?.passes).toBe(1);
  });
});
