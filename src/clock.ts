// Time, injected. Every loop, cache and timer of the process reads time and sets timers through
// a Clock, so tests can move time (test/helpers/fake-clock.ts) instead of sleeping.

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

/**
 * Calls `fn` every `ms` on the clock (the next call is set before `fn` runs, so a call that
 * throws does not end the series) until the returned stop function is called.
 */
export function every(clock: Clock, ms: number, fn: () => void): () => void {
  let stopped = false;
  let handle: TimerHandle = undefined;
  const tick = (): void => {
    if (stopped) return;
    handle = clock.setTimeout(tick, ms);
    fn();
  };
  handle = clock.setTimeout(tick, ms);
  return () => {
    stopped = true;
    clock.clearTimeout(handle);
  };
}
