// Waiting on I/O without sleeping: event-loop turns (setImmediate), so a test waits for a stat
// or a socket to answer, never for wall-clock time to pass.

/** Lets `n` event-loop turns pass (pending I/O callbacks run in between). */
export async function turns(n = 20): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

/**
 * Turns the event loop until `check` returns a value other than undefined or false. `limitMs`
 * of wall time only bounds a failing test; nothing waits for it to pass.
 */
export async function turnsUntil<T>(check: () => T | undefined | false, what: string, limitMs = 10_000): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${limitMs} ms`);
    await new Promise((r) => setImmediate(r));
  }
}
