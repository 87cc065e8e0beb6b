// A Clock that moves only when a test says so.

import type { Clock, TimerHandle } from '../../src/clock.js';

interface FakeTimer {
  id: number;
  due: number;
  fn: () => void;
}

/**
 * A clock that moves only when told. `advance(ms)` fires every timer that falls due within the
 * window in due order (ties in the order they were set), including timers set by those
 * callbacks, and leaves `now()` at the end of the window.
 */
export class FakeClock implements Clock {
  #now: number;
  #seq = 0;
  #timers = new Map<number, FakeTimer>();

  constructor(start = Date.UTC(2025, 0, 1)) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = ++this.#seq;
    this.#timers.set(id, { id, due: this.#now + Math.max(0, ms), fn });
    return id;
  }

  clearTimeout(handle: TimerHandle): void {
    if (typeof handle === 'number') this.#timers.delete(handle);
  }

  /** Moves time forward by `ms`, firing due timers in order. */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`advance(ms) needs ms >= 0, got ${ms}`);
    const end = this.#now + ms;
    for (;;) {
      const next = this.#earliest();
      if (next === undefined || next.due > end) break;
      this.#timers.delete(next.id);
      this.#now = Math.max(this.#now, next.due);
      next.fn();
    }
    this.#now = end;
  }

  /** Moves time to the next pending timer and fires it (and any due at the same instant). */
  advanceToNext(): boolean {
    const next = this.#earliest();
    if (next === undefined) return false;
    this.advance(next.due - this.#now);
    return true;
  }

  /** Number of timers not yet fired or cleared. */
  pendingTimers(): number {
    return this.#timers.size;
  }

  /** When the earliest pending timer is due, or undefined. */
  nextDue(): number | undefined {
    return this.#earliest()?.due;
  }

  #earliest(): FakeTimer | undefined {
    let best: FakeTimer | undefined;
    for (const t of this.#timers.values()) {
      if (best === undefined || t.due < best.due || (t.due === best.due && t.id < best.id)) best = t;
    }
    return best;
  }
}

interface JumpTimer {
  due: number;
  fn: () => void;
  real: ReturnType<typeof setTimeout>;
}

/**
 * Real time that a test can also move forward at once: timers run on real timers as usual, and
 * `jump(ms)` moves `now()` ahead and fires every timer that falls due. For a whole daemon, whose
 * loops need time to pass by themselves, when a test wants one long wait (an idle timeout) to
 * be over without sleeping through it.
 */
export class JumpClock implements Clock {
  #offset = 0;
  #seq = 0;
  #timers = new Map<number, JumpTimer>();

  now(): number {
    return Date.now() + this.#offset;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = ++this.#seq;
    const real = setTimeout(() => this.#fire(id), Math.max(0, ms));
    real.unref();
    this.#timers.set(id, { due: this.now() + Math.max(0, ms), fn, real });
    return id;
  }

  clearTimeout(handle: TimerHandle): void {
    if (typeof handle !== 'number') return;
    const t = this.#timers.get(handle);
    if (t === undefined) return;
    clearTimeout(t.real);
    this.#timers.delete(handle);
  }

  /** Moves time forward by `ms` and fires, in due order, every timer due by then (and those they set). */
  jump(ms: number): void {
    this.#offset += ms;
    for (;;) {
      let next: [number, JumpTimer] | undefined;
      for (const e of this.#timers) if (e[1].due <= this.now() && (next === undefined || e[1].due < next[1].due)) next = e;
      if (next === undefined) return;
      clearTimeout(next[1].real);
      this.#fire(next[0]);
    }
  }

  #fire(id: number): void {
    const t = this.#timers.get(id);
    if (t === undefined) return;
    this.#timers.delete(id);
    t.fn();
  }
}
