import { describe, expect, it } from 'vitest';
import { every, KeyTimers } from '../src/clock.js';
import { FakeClock } from './helpers/fake-clock.js';

describe('FakeClock', () => {
  it('fires due timers in due order, ties in the order set, and ones set by callbacks inside the window', () => {
    const clock = new FakeClock(0);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push(`b@${clock.now()}`), 20);
    clock.setTimeout(() => {
      fired.push(`a@${clock.now()}`);
      clock.setTimeout(() => fired.push(`c@${clock.now()}`), 5);
    }, 10);
    clock.setTimeout(() => fired.push(`b2@${clock.now()}`), 20);
    const late = clock.setTimeout(() => fired.push('late'), 100);
    clock.advance(20);
    expect(fired).toEqual(['a@10', 'c@15', 'b@20', 'b2@20']);
    expect(clock.now()).toBe(20);
    clock.clearTimeout(late);
    clock.advance(1_000);
    expect(fired).toHaveLength(4);
    expect(clock.pendingTimers()).toBe(0);
  });

  it('advanceToNext jumps to the next timer', () => {
    const clock = new FakeClock(1_000);
    let n = 0;
    clock.setTimeout(() => n++, 5_000);
    expect(clock.nextDue()).toBe(6_000);
    expect(clock.advanceToNext()).toBe(true);
    expect(n).toBe(1);
    expect(clock.now()).toBe(6_000);
    expect(clock.advanceToNext()).toBe(false);
  });
});

describe('KeyTimers', () => {
  it('keeps one timer per key; setting again replaces it', () => {
    const clock = new FakeClock(0);
    const t = new KeyTimers(clock);
    const fired: string[] = [];
    t.set('a', 10, () => fired.push('a1'));
    t.set('a', 30, () => fired.push('a2'));
    t.set('b', 20, () => fired.push('b'));
    clock.advance(25);
    expect(fired).toEqual(['b']);
    expect(t.has('a')).toBe(true);
    t.clearAll();
    clock.advance(100);
    expect(fired).toEqual(['b']);
  });
});

describe('every', () => {
  it('repeats on the clock, keeps going after a call that throws, and stops when told', () => {
    const clock = new FakeClock(0);
    const at: number[] = [];
    const stop = every(clock, 100, () => {
      at.push(clock.now());
      if (at.length === 2) throw new Error('one bad tick');
    });
    expect(() => clock.advance(200)).toThrow('one bad tick');
    clock.advance(150);
    expect(at).toEqual([100, 200, 300]);
    stop();
    clock.advance(1_000);
    expect(at).toEqual([100, 200, 300]);
    expect(clock.pendingTimers()).toBe(0);
  });
});
