// The watch/close bookkeeping the database stores share: their change detection (a poll timer,
// a LISTEN connection) runs only while someone watches an open store, and close() stops it once.

import type { ChangeListener, RowTracker } from './watched-store.js';

export interface ChangeDetection {
  start(): void;
  stop(): void | Promise<void>;
}

export class Watching {
  #closed = false;
  #running = false;

  constructor(
    private readonly tracker: RowTracker,
    private readonly detection: ChangeDetection,
  ) {}

  get closed(): boolean {
    return this.#closed;
  }

  /** Subscribes; the first listener of an open store starts the detection, the last one leaving stops it. */
  watch(listener: ChangeListener): () => void {
    const unsubscribe = this.tracker.subscribe(listener);
    if (!this.#running && !this.#closed) {
      this.#running = true;
      this.detection.start();
    }
    return () => {
      unsubscribe();
      if (!this.tracker.watched) void this.#stop();
    };
  }

  /** Stops the detection. True the first time only: the caller then releases its database. */
  async close(): Promise<boolean> {
    if (this.#closed) return false;
    this.#closed = true;
    await this.#stop();
    return true;
  }

  async #stop(): Promise<void> {
    if (!this.#running) return;
    this.#running = false;
    await this.detection.stop();
  }
}
