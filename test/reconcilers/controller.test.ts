import { afterEach, describe, expect, it } from 'vitest';
import { ProxyError, TerminalError } from '../../src/errors.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { findCondition } from '../../src/reconcilers/conditions.js';
import { Controller, type ControllerOptions } from '../../src/reconcilers/controller.js';
import type { LoopStatus } from '../../src/reconcilers/types.js';
import { deferred, fakeLoop, specWith, until, type FakeLoop, type Spec } from './fake-loop.js';

const controllers: Controller[] = [];
afterEach(async () => {
  await Promise.all(controllers.splice(0).map((c) => c.stop()));
});

function setup(loops: FakeLoop[], spec: { current: Spec }, opts: Partial<ControllerOptions> = {}) {
  const clock = new FakeClock();
  const c = new Controller({
    loops: loops.map((l) => l.loop),
    getSpec: () => spec.current,
    clock,
    random: () => 0.5, // jitter off: delays are exactly 1 s, 2 s, 4 s, …
    ...opts,
  });
  controllers.push(c);
  return { c, clock };
}

const c2passes = (c: Controller, loop: string) => c.counters()[loop]?.passes ?? 0;
const cond = (s: LoopStatus | undefined, type: string) => (s ? findCondition(s.conditions, type) : undefined);

describe('Controller', () => {
  it('reconcileAll converges, reports Ready per object and per loop with observedGeneration', async () => {
    const spec = { current: specWith(3, { a: 1, b: 2 }) };
    const f = fakeLoop({ name: 'files' });
    const { c } = setup([f], spec);
    await c.reconcileAll();
    expect(Object.fromEntries(f.world)).toEqual({ a: '1', b: '2' });
    const s = c.statuses();
    expect(s.generation).toBe(3);
    const files = s.loops.files;
    expect(cond(files, 'Ready')).toMatchObject({ status: 'True', reason: 'Converged', observedGeneration: 3 });
    expect(cond(files, 'Degraded')).toMatchObject({ status: 'False', observedGeneration: 3 });
    expect(files?.objects.a?.conditions[0]).toMatchObject({ type: 'Ready', status: 'True', observedGeneration: 3 });
    expect(c.counters().files).toMatchObject({ passes: 1, errors: 0, actionsApplied: 2 });
  });

  it('status is not rewritten when nothing changed: lastTransitionTime and listeners stay put', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const f = fakeLoop({ name: 'files' });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    const t0 = cond(c.statuses().loops.files, 'Ready')?.lastTransitionTime;
    const events: string[] = [];
    c.onStatus((loop) => events.push(loop));
    clock.advance(5_000);
    await c.reconcileAll();
    expect(cond(c.statuses().loops.files, 'Ready')?.lastTransitionTime).toEqual(t0);
    expect(events).toEqual([]);
  });

  it('a failing key retries with per-key backoff on the fake clock and does not block other keys', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1, c: 1 }) };
    const extra = new Map<string, string>();
    const f = fakeLoop({
      name: 'files',
      want: (s) => new Map([...s.spec.services.map((x): [string, string] => [x.run, '1']), ...extra]),
      fail: (key, attempt) => (key === 'b' && attempt <= 2 ? new Error(`b broke (${attempt})`) : undefined),
    });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    expect([...f.world.keys()].sort()).toEqual(['a', 'c']);
    let files = c.statuses().loops.files;
    expect(files?.failures.b).toMatchObject({ attempts: 1, terminal: false, message: 'b broke (1)' });
    expect(cond(files, 'Ready')).toMatchObject({ status: 'False', reason: 'ActionsFailing' });
    expect(cond(files, 'Degraded')).toMatchObject({ status: 'True' });
    expect(files?.objects.b?.conditions[0]).toMatchObject({ status: 'False', reason: 'ApplyFailed' });

    // While b waits out its backoff, another pass skips b but still applies a new key.
    extra.set('d', '1');
    await c.reconcileAll();
    expect(f.world.get('d')).toBe('1');
    expect(f.attempts.get('b')).toBe(1);

    clock.advance(999);
    await c.whenIdle();
    expect(f.attempts.get('b')).toBe(1);
    clock.advance(1); // 1 s after the first failure
    await c.whenIdle();
    expect(f.attempts.get('b')).toBe(2);
    expect(c.statuses().loops.files?.failures.b?.attempts).toBe(2);

    clock.advance(1_999);
    await c.whenIdle();
    expect(f.attempts.get('b')).toBe(2);
    clock.advance(1); // 2 s after the second failure
    await c.whenIdle();
    expect(f.attempts.get('b')).toBe(3);
    expect(f.world.get('b')).toBe('1');
    files = c.statuses().loops.files;
    expect(files?.failures).toEqual({});
    expect(cond(files, 'Ready')).toMatchObject({ status: 'True' });
    expect(files?.objects.b?.conditions[0]).toMatchObject({ status: 'True' });
    expect(c.counters().files?.errors).toBe(2);
    // a and c were applied exactly once: retries touched only b
    expect(f.attempts.get('a')).toBe(1);
    expect(f.attempts.get('c')).toBe(1);
  });

  it('a slow key does not hold up other keys beyond the concurrency limit', async () => {
    const spec = { current: specWith(1, { slow: 1, x: 1, y: 1 }) };
    const gate = deferred();
    const f = fakeLoop({ name: 'files', gate: (k) => (k === 'slow' ? gate.promise : undefined) });
    const { c } = setup([f], spec, { concurrency: 2 });
    const done = c.reconcileAll();
    await until(() => f.world.has('x') && f.world.has('y'));
    expect(f.world.has('slow')).toBe(false);
    gate.resolve();
    await done;
    expect(f.world.has('slow')).toBe(true);
  });

  it('a TerminalError is not retried until the next generation', async () => {
    const spec = { current: specWith(1, { a: 1, bad: 1 }) };
    let terminal = true;
    const f = fakeLoop({
      name: 'files',
      fail: (key) => (key === 'bad' && terminal ? new TerminalError('bad cannot work') : undefined),
    });
    const { c, clock } = setup([f], spec);
    await c.start();
    expect(f.world.has('a')).toBe(true);
    expect(c.statuses().loops.files?.failures.bad).toMatchObject({ terminal: true, message: 'bad cannot work' });
    expect(c.statuses().loops.files?.failures.bad?.retryAt).toBeUndefined();
    expect(cond(c.statuses().loops.files, 'Ready')).toMatchObject({ status: 'False', reason: 'ActionsFailedTerminally' });

    for (let i = 0; i < 10; i++) {
      clock.advance(60_000); // resyncs fire, backoff would long have elapsed
      await c.whenIdle();
    }
    expect(c.counters().files?.passes).toBeGreaterThanOrEqual(11);
    expect(f.attempts.get('bad')).toBe(1);

    terminal = false;
    spec.current = specWith(2, { a: 1, bad: 1 });
    c.notify();
    await c.whenIdle();
    expect(f.attempts.get('bad')).toBe(2);
    expect(f.world.has('bad')).toBe(true);
    expect(cond(c.statuses().loops.files, 'Ready')).toMatchObject({ status: 'True', observedGeneration: 2 });
  });

  it('notify() with a new generation triggers a pass that converges to it', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1 }) };
    const f = fakeLoop({ name: 'files' });
    const { c } = setup([f], spec);
    await c.reconcileAll();
    spec.current = specWith(2, { a: 5, c: 1 });
    c.notify();
    await c.whenIdle();
    expect(Object.fromEntries(f.world)).toEqual({ a: '5', c: '1' });
    const files = c.statuses().loops.files;
    expect(files?.objects.a?.conditions[0]).toMatchObject({ observedGeneration: 2, message: 'value 5' });
    expect(files?.objects.b).toBeUndefined();
    expect(cond(files, 'Ready')?.observedGeneration).toBe(2);
  });

  it('a status change of a dependency triggers the dependent loop, dependencies run first', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const certs = fakeLoop({ name: 'certs' });
    // sites wants one entry per certificate that certs reports Ready
    const sites = fakeLoop({
      name: 'sites',
      dependsOn: ['certs'],
      want: (_s, statuses) => {
        const objects = statuses.loops.certs?.objects ?? {};
        return new Map(
          Object.entries(objects)
            .filter(([, cs]) => cs.conditions.some((x) => x.type === 'Ready' && x.status === 'True'))
            .map(([k]) => [`site-${k}`, 'tls']),
        );
      },
    });
    const { c } = setup([sites, certs], spec);
    await c.reconcileAll();
    expect([...sites.world.keys()]).toEqual(['site-a']); // certs ran first

    spec.current = specWith(2, { a: 1, b: 1 });
    c.notify();
    await c.whenIdle();
    expect([...sites.world.keys()].sort()).toEqual(['site-a', 'site-b']);

    // A status write outside any pass (a connection dropping) also triggers the dependent.
    const passes = c.counters().sites?.passes ?? 0;
    certs.ctx?.status.set('a', { type: 'Ready', status: 'False', reason: 'Expired', message: 'expired' });
    await c.whenIdle();
    expect(c.counters().sites?.passes).toBe(passes + 1);
    expect([...sites.world.keys()]).toEqual(['site-b']);
  });

  it('a dependent acts only once every dependency settled, also when another one triggered it', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let gate: ReturnType<typeof deferred> | undefined;
    const sockets = fakeLoop({ name: 'sockets', gate: () => gate?.promise });
    const certs = fakeLoop({ name: 'certs' });
    /** For each site applied: did its socket exist at that moment? */
    const socketThere: boolean[] = [];
    const sites = fakeLoop({
      name: 'sites',
      dependsOn: ['certs', 'sockets'],
      want: (s) => new Map(s.spec.services.map((x) => [`site-${x.run}`, 'on'])),
      gate: (key) => {
        socketThere.push(sockets.world.has(key.slice('site-'.length)));
        return undefined;
      },
    });
    const { c } = setup([sites, certs, sockets], spec);
    await c.reconcileAll();

    // certs finishes first; its status change triggers sites while sockets is still applying.
    gate = deferred();
    spec.current = specWith(2, { a: 1, b: 1 });
    c.notify();
    await until(() => certs.world.has('b') && sockets.applied.includes('b'));
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    expect(sites.world.has('site-b')).toBe(false);
    const passes = c.counters().sites?.passes ?? 0;
    gate.resolve();
    await c.whenIdle();
    expect(sites.world.has('site-b')).toBe(true);
    expect(socketThere).toEqual([true, true]);
    // The pass that waited read everything afterwards: no second pass for the same news.
    expect(c.counters().sites?.passes).toBe(passes + 1);
  });

  it('a dependency left out of triggeredBy is still waited for, but its status changes trigger no pass', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let gate: ReturnType<typeof deferred> | undefined;
    // sockets fails c once: its retry a second later changes its status, and nothing else.
    const sockets = fakeLoop({
      name: 'sockets',
      gate: () => gate?.promise,
      fail: (key, attempt) => (key === 'c' && attempt === 1 ? new Error('busy') : undefined),
    });
    const certs = fakeLoop({ name: 'certs' });
    const socketThere: boolean[] = [];
    const siteWorld = (s: Spec['state']) => new Map(s.spec.services.map((x): [string, string] => [`site-${x.run}`, 'on']));
    const sites = fakeLoop({
      name: 'sites',
      dependsOn: ['certs', 'sockets'],
      triggeredBy: ['certs'],
      want: siteWorld,
      gate: (key) => {
        socketThere.push(sockets.world.has(key.slice('site-'.length)));
        return undefined;
      },
    });
    // The same dependencies, every status change a trigger (the default).
    const readsAll = fakeLoop({ name: 'readsAll', dependsOn: ['certs', 'sockets'], want: siteWorld });
    const { c, clock } = setup([sites, readsAll, certs, sockets], spec);
    await c.reconcileAll();

    // Still ordered: a new site waits for its socket.
    gate = deferred();
    spec.current = specWith(2, { a: 1, b: 1 });
    c.notify();
    await until(() => certs.world.has('b') && sockets.applied.includes('b'));
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    expect(sites.world.has('site-b')).toBe(false);
    gate.resolve();
    gate = undefined;
    await c.whenIdle();
    expect(sites.world.has('site-b')).toBe(true);
    expect(socketThere).toEqual([true, true]);

    spec.current = specWith(3, { a: 1, b: 1, c: 1 });
    await c.reconcileAll();
    expect(c.statuses().loops.sockets?.failures.c).toBeDefined();
    const passes = { sites: c2passes(c, 'sites'), readsAll: c2passes(c, 'readsAll') };
    const changed: string[] = [];
    c.onStatus((loop) => changed.push(loop));
    clock.advance(1_000); // sockets retries c: a status change of sockets only
    await c.whenIdle();
    expect(sockets.world.has('c')).toBe(true);
    expect(changed).toContain('sockets');
    expect(c2passes(c, 'readsAll')).toBe(passes.readsAll + 1);
    expect(c2passes(c, 'sites')).toBe(passes.sites);
  });

  it('rejects triggeredBy a loop it does not depend on', () => {
    const getSpec = () => specWith(1, {});
    const x = fakeLoop({ name: 'x', dependsOn: [], triggeredBy: ['y'] });
    expect(() => new Controller({ loops: [x.loop, fakeLoop({ name: 'y' }).loop], getSpec })).toThrow(
      /triggered by y, which it does not depend on/,
    );
  });

  it('a dependency that always has another pass queued does not starve its dependent', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let spinning = true;
    let ticks = 0;
    let clock: { advance(ms: number): void } | undefined;
    // Every pass of `busy` plans an action that requeues at once; the requeue fires while the
    // next pass is in flight, so `busy` always has a pass running or pending (as a TLS loop
    // does with hundreds of domains whose DNS is not there yet).
    const busy = fakeLoop({
      name: 'busy',
      want: () => new Map([['tick', String(++ticks)]]),
      requeue: () => (spinning ? 0 : undefined),
      gate: () => (spinning ? new Promise<void>((r) => setImmediate(() => (clock?.advance(0), r()))) : undefined),
    });
    const sites = fakeLoop({ name: 'sites', dependsOn: ['busy'] });
    const s = setup([sites, busy], spec);
    clock = s.clock;
    void s.c.reconcileAll();
    try {
      await until(() => sites.world.get('a') === '1');
      spec.current = specWith(2, { a: 1, b: 2 });
      s.c.notify();
      await until(() => sites.world.get('b') === '2');
      expect(c2passes(s.c, 'busy')).toBeGreaterThan(2);
    } finally {
      spinning = false;
    }
    await s.c.whenIdle();
  });

  it('a dependency that settles after planning lets its dependent run while its actions are in flight', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const gate = deferred();
    const certs = fakeLoop({ name: 'certs', settlesAfter: 'plan', gate: () => gate.promise });
    const sites = fakeLoop({
      name: 'sites',
      dependsOn: ['certs'],
      want: (st, statuses) => {
        const ready = Object.keys(statuses.loops.certs?.objects ?? {});
        return new Map(st.spec.services.map((x) => [x.run, ready.includes(x.run) ? 'tls' : 'plain']));
      },
    });
    const { c } = setup([sites, certs], spec);
    const first = c.reconcileAll();
    try {
      await until(() => sites.world.get('a') === 'plain'); // certs' action is still held
      expect(certs.world.has('a')).toBe(false);
      await c.whenSettled();
    } finally {
      gate.resolve();
    }
    await first;
    await c.whenIdle();
    // The certificate's status change reached the dependent on its own.
    expect(sites.world.get('a')).toBe('tls');
  });

  it('each loop applies on its own queue: a slow action of one loop does not hold up another loop', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1 }) };
    const gate = deferred();
    const slow = fakeLoop({ name: 'slow', gate: () => gate.promise });
    const fast = fakeLoop({ name: 'fast' });
    const { c } = setup([slow, fast], spec, { concurrency: 1 });
    const first = c.reconcileAll();
    try {
      await until(() => fast.world.size === 2);
      expect(slow.world.size).toBe(0);
    } finally {
      gate.resolve();
    }
    await first;
    expect(slow.world.size).toBe(2);
  });

  it('the top-level observedGeneration moves only once every loop observed the generation', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let gate: ReturnType<typeof deferred> | undefined;
    const a = fakeLoop({ name: 'a' });
    const b = fakeLoop({ name: 'b', observeGate: () => gate?.promise });
    const { c } = setup([a, b], spec);
    expect(c.statuses().observedGeneration).toBe(0);
    await c.reconcileAll();
    expect(c.statuses()).toMatchObject({ generation: 1, observedGeneration: 1 });
    gate = deferred();
    spec.current = specWith(2, { a: 2 });
    c.notify();
    try {
      await until(() => a.world.get('a') === '2');
      expect(cond(c.statuses().loops.a, 'Ready')?.observedGeneration).toBe(2);
      expect(c.statuses()).toMatchObject({ generation: 2, observedGeneration: 1 });
    } finally {
      gate.resolve();
    }
    await c.whenIdle();
    expect(c.statuses()).toMatchObject({ generation: 2, observedGeneration: 2 });
  });

  it('whenSettled waits for the first pass also at generation 0', async () => {
    const spec = { current: specWith(0, { a: 1 }) };
    const gate = deferred();
    const f = fakeLoop({ name: 'files', observeGate: () => gate.promise });
    const { c } = setup([f], spec);
    void c.start();
    let settled = false;
    const w = c.whenSettled().then(() => (settled = true));
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    expect(settled).toBe(false);
    gate.resolve();
    await w;
    expect(f.world.get('a')).toBe('1');
  });

  it("a watcher is triggered by the watched loop's status changes and never waits for it", async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let gate: ReturnType<typeof deferred> | undefined;
    // sockets keeps a key while sites still has it (the order of a removal), and watches sites.
    const sockets = fakeLoop({
      name: 'sockets',
      watches: ['sites'],
      want: (st, statuses) =>
        new Map([...st.spec.services.map((x) => x.run), ...Object.keys(statuses.loops.sites?.objects ?? {})].map((k) => [k, 'on'])),
    });
    const sites = fakeLoop({ name: 'sites', dependsOn: ['sockets'], gate: () => gate?.promise });
    const { c } = setup([sites, sockets], spec);
    await c.reconcileAll();
    expect([...sockets.world.keys()]).toEqual(['a']);
    gate = deferred();
    spec.current = specWith(2, { b: 1 });
    c.notify();
    try {
      await until(() => sockets.world.has('b') && sites.applied.includes('a'));
      expect(sockets.world.has('a')).toBe(true); // sites has not removed `a` yet
    } finally {
      gate.resolve();
    }
    await c.whenIdle();
    expect([...sites.world.keys()]).toEqual(['b']);
    expect([...sockets.world.keys()]).toEqual(['b']);
  });

  it('the periodic resync repairs drift', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const f = fakeLoop({ name: 'files' });
    const { c, clock } = setup([f], spec, { resyncIntervalMs: 30_000 });
    await c.start();
    expect(c.counters().files?.passes).toBe(1);
    f.world.set('a', 'tampered');
    f.world.set('stray', 'x');
    clock.advance(29_999);
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(1);
    clock.advance(1);
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(2);
    expect(Object.fromEntries(f.world)).toEqual({ a: '1' });
    clock.advance(30_000);
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(3);
  });

  it('passes of one loop never overlap; triggers during a pass coalesce into one more pass', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let gate: ReturnType<typeof deferred> | undefined = deferred();
    const f = fakeLoop({ name: 'files', observeGate: () => gate?.promise });
    const { c } = setup([f], spec);
    const first = c.reconcileAll();
    await until(() => f.observes === 1);
    c.notify();
    c.notify();
    const second = c.reconcileAll();
    const g = gate;
    gate = undefined;
    g.resolve();
    await Promise.all([first, second]);
    await c.whenIdle();
    expect(f.observes).toBe(2);
    expect(f.maxConcurrentObserves).toBe(1);
  });

  it('requeueAfterMs runs the loop again after the delay', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const f = fakeLoop({ name: 'files', requeue: (k) => (k === 'a' ? 10_000 : undefined) });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    expect(cond(c.statuses().loops.files, 'Ready')?.status).toBe('True');
    clock.advance(9_999);
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(1);
    clock.advance(1);
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(2);
  });

  it('applyBatch gets every eligible action at once; a failed key is retried alone', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1, c: 1 }) };
    const f = fakeLoop({
      name: 'nginx',
      batch: true,
      fail: (key, attempt) => (key === 'b' && attempt === 1 ? new Error('nginx -t failed') : undefined),
    });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    expect(f.batches).toEqual([['a', 'b', 'c']]);
    expect(c.statuses().loops.nginx?.failures.b?.message).toBe('nginx -t failed');
    clock.advance(1_000);
    await c.whenIdle();
    expect(f.batches).toEqual([['a', 'b', 'c'], ['b']]);
    expect(cond(c.statuses().loops.nginx, 'Ready')?.status).toBe('True');
  });

  it('a failing observe marks the loop Degraded and retries the pass with backoff', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    let broken = true;
    const f = fakeLoop({ name: 'files', observeError: () => (broken ? new Error('disk gone') : undefined) });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    expect(cond(c.statuses().loops.files, 'Degraded')).toMatchObject({ status: 'True', reason: 'PassFailed' });
    expect(c.counters().files?.errors).toBe(1);
    broken = false;
    clock.advance(1_000);
    await c.whenIdle();
    expect(f.world.get('a')).toBe('1');
    expect(cond(c.statuses().loops.files, 'Ready')?.status).toBe('True');
  });

  it('stop() drains in-flight actions, skips unstarted ones and stops all triggers', async () => {
    const spec = { current: specWith(1, { p: 1, q: 1 }) };
    const hold = deferred();
    const f = fakeLoop({ name: 'held', gate: () => hold.promise });
    const { c, clock } = setup([f], spec, { concurrency: 1 });
    const starting = c.start();
    await until(() => f.applied.length === 1);
    let stopped = false;
    const stopping = c.stop().then(() => (stopped = true));
    await new Promise((r) => setImmediate(r));
    expect(stopped).toBe(false); // p is still in flight
    hold.resolve();
    await stopping;
    await starting;
    expect([...f.world.keys()]).toEqual(['p']); // in-flight p finished, queued q never started
    expect(f.applied).toEqual(['p']);
    expect(clock.pendingTimers()).toBe(0); // resync and retry timers are gone
    c.notify();
    await c.reconcileAll();
    clock.advance(10 * 60_000);
    await c.whenIdle();
    expect(f.observes).toBe(1);
  });

  it('a key that drops out of the plan forgets its failure; a TerminalError from observe is not retried', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1 }) };
    let observeErr: Error | undefined;
    const f = fakeLoop({
      name: 'files',
      fail: (key) => (key === 'b' ? new Error('nope') : undefined),
      observeError: () => observeErr,
    });
    const { c, clock } = setup([f], spec);
    await c.reconcileAll();
    expect(Object.keys(c.statuses().loops.files?.failures ?? {})).toEqual(['b']);
    spec.current = specWith(2, { a: 1 });
    c.notify();
    await c.whenIdle();
    expect(c.statuses().loops.files?.failures).toEqual({});
    expect(cond(c.statuses().loops.files, 'Ready')?.status).toBe('True');

    observeErr = new TerminalError('config dir is a file');
    await c.reconcileAll();
    expect(c.statuses().loops.files?.failures['(pass)']).toMatchObject({ terminal: true });
    const passes = c.counters().files?.passes;
    clock.advance(59_000); // no resync started, so only a retry timer could run it
    await c.whenIdle();
    expect(c.counters().files?.passes).toBe(passes);
  });

  it('a getSpec that throws fails the pass without wedging the loop', async () => {
    let broken = true;
    const good = specWith(1, { a: 1 });
    const f = fakeLoop({ name: 'files' });
    const clock = new FakeClock();
    const c = new Controller({
      loops: [f.loop],
      getSpec: () => {
        if (broken) throw new Error('store unreadable');
        return good;
      },
      clock,
      random: () => 0.5,
    });
    controllers.push(c);
    await c.reconcileAll();
    expect(c.counters().files?.errors).toBe(1);
    broken = false;
    clock.advance(1_000);
    await c.whenIdle();
    expect(f.world.get('a')).toBe('1');
  });

  it('listeners get one status event per pass that changed something', async () => {
    const spec = { current: specWith(1, { a: 1, b: 1, c: 1 }) };
    const f = fakeLoop({ name: 'files' });
    const { c } = setup([f], spec);
    const events: [string, string[]][] = [];
    c.onStatus((loop, s) => events.push([loop, Object.keys(s.objects)]));
    await c.reconcileAll();
    expect(events).toEqual([['files', ['a', 'b', 'c']]]);
  });

  it('rejects bad options at the door', () => {
    const spec = { current: specWith(1, {}) };
    const a = fakeLoop({ name: 'a', dependsOn: ['b'] });
    const b = fakeLoop({ name: 'b', dependsOn: ['a'] });
    const getSpec = () => spec.current;
    expect(() => new Controller({ loops: [a.loop, b.loop], getSpec })).toThrow(/depend on each other/);
    expect(() => new Controller({ loops: [fakeLoop({ name: 'x', dependsOn: ['nope'] }).loop], getSpec })).toThrow(ProxyError);
    expect(() => new Controller({ loops: [fakeLoop({ name: 'x' }).loop, fakeLoop({ name: 'x' }).loop], getSpec })).toThrow(/two loops/);
    expect(() => new Controller({ loops: [], getSpec, concurrency: 0 })).toThrow(ProxyError);
    expect(() => new Controller({ loops: [], getSpec, backoff: { jitter: 2 } })).toThrow(ProxyError);
  });

  it('dryRun plans without applying or writing status', async () => {
    const spec = { current: specWith(1, { a: 1 }) };
    const f = fakeLoop({ name: 'files' });
    const { c } = setup([f], spec);
    await c.reconcileAll();
    const plan = await c.dryRun(specWith(2, { a: 2, b: 1 }).state);
    expect(plan.files?.map((x) => [x.kind, x.key])).toEqual([
      ['update', 'a'],
      ['create', 'b'],
    ]);
    expect(Object.fromEntries(f.world)).toEqual({ a: '1' });
    expect(f.applied).toEqual(['a']);
  });
});
