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
