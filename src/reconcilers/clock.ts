// Time, injected. Every reconciler reads time and sets timers through a Clock so tests can
// move time with FakeClock instead of sleeping.

/** An opaque timer handle: pass it back to the clock that made it. */
export type TimerHandle = unknown;

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

/** The real clock. Its timers are unref'd: a pending retry or resync never keeps the process alive. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, Math.max(0, ms));
    t.unref();
    return t;
  },
  clearTimeout(handle) {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};

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

/** At most one pending timer per key on a clock; setting a key again replaces its timer. */
export class KeyTimers {
  readonly #clock: Clock;
  readonly #handles = new Map<string, TimerHandle>();

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  set(key: string, ms: number, fn: () => void): void {
    this.clear(key);
    this.#handles.set(
      key,
      this.#clock.setTimeout(() => {
        this.#handles.delete(key);
        fn();
      }, ms),
    );
  }

  clear(key: string): void {
    const h = this.#handles.get(key);
    if (h === undefined) return;
    this.#clock.clearTimeout(h);
    this.#handles.delete(key);
  }

  clearAll(): void {
    for (const key of [...this.#handles.keys()]) this.clear(key);
  }

  has(key: string): boolean {
    return this.#handles.has(key);
  }
}
