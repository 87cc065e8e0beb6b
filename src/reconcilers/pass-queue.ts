// Scheduling of one loop's passes: at most one runs at a time, and triggers that arrive while
// one runs coalesce into exactly one more. Every trigger gets a promise that resolves when a
// pass that started after it (or claimed it, see claim()) has ended.

export interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
}

export function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

export class PassQueue {
  readonly #run: () => Promise<void>;
  readonly #ended: () => void;
  #running: Promise<void> | null = null;
  #pending: Deferred | null = null;
  #stopped = false;

  /**
   * `run` is one pass (it must not reject: the caller logs what it throws); `ended` is called
   * after each pass has ended and the next one, if any, has been started.
   */
  constructor(run: () => Promise<void>, ended: () => void) {
    this.#run = run;
    this.#ended = ended;
  }

  /** Asks for a pass; resolves once one that covers this call has ended (at once after stop()). */
  trigger(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    this.#pending ??= deferred();
    const p = this.#pending.promise;
    if (this.#running === null) this.#start();
    return p;
  }

  /**
   * Called by a running pass at the moment it reads its inputs: the triggers that arrived since
   * it started are covered by it rather than by one more pass. Resolve the result when done.
   */
  claim(): Deferred | null {
    const covered = this.#pending;
    this.#pending = null;
    return covered;
  }

  /** A pass is running or asked for. */
  get busy(): boolean {
    return this.#running !== null || this.#pending !== null;
  }

  /** The running pass (resolves when it has ended), or null. */
  get running(): Promise<void> | null {
    return this.#running;
  }

  /** What whenIdle waits for: the running pass and the one asked for after it. */
  inFlight(): Promise<void>[] {
    return [this.#running, this.#pending?.promise].filter((p) => p != null);
  }

  /** No pass starts from now on; a trigger waiting for one that will not come resolves now. */
  stop(): void {
    this.#stopped = true;
    if (this.#running === null) this.#releasePending();
  }

  #start(): void {
    const d = this.#pending ?? deferred();
    this.#pending = null;
    this.#running = this.#run().then(() => {
      this.#running = null;
      d.resolve();
      if (this.#pending !== null) {
        if (this.#stopped) this.#releasePending();
        else this.#start();
      }
      this.#ended();
    });
  }

  #releasePending(): void {
    this.#pending?.resolve();
    this.#pending = null;
  }
}
