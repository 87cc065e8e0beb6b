// Follows one log file across rotation and truncation and hands complete lines to a consumer.
//
// - rotation (rename + reopen, logrotate `create`): the path names a new inode. The old file is
//   kept open and drained for `rotateGraceMs`, since Nginx workers write to it until they reopen.
// - truncation (logrotate `copytruncate`): the file is shorter than what was read; start over.
// - a half-written last line stays in a carry buffer until its newline arrives.
// - a line longer than maxLineBytes is skipped up to its newline and counted as malformed.

import { open, stat, type FileHandle } from 'node:fs/promises';
import { systemClock, type Clock } from '../clock.js';

/** Parses b[start, end), returns where the unconsumed rest (an incomplete last line) begins. */
export type ChunkConsumer = (b: Buffer, start: number, end: number) => number;

export interface LogTailOptions {
  path: string;
  consume: ChunkConsumer;
  /** A file already there at the first poll is read from its end (default) or its start. */
  startAt?: 'end' | 'start';
  /** How long a rotated file is still drained. Default 30 s. */
  rotateGraceMs?: number;
  /** Default 4 MiB. */
  chunkBytes?: number;
  /** Default 16 KiB. */
  maxLineBytes?: number;
  clock?: Clock;
}

export interface TailCounters {
  bytes: number;
  rotations: number;
  truncations: number;
  /** Overlong lines and half lines left behind by rotation or truncation. */
  dropped: number;
}

interface Tracked {
  fh: FileHandle;
  dev: number;
  ino: number;
  offset: number;
  carry: Buffer;
  /** Inside an overlong line: ignore bytes up to the next newline. */
  skipping: boolean;
  retireAt: number | null;
}

export class LogTail {
  readonly counters: TailCounters = { bytes: 0, rotations: 0, truncations: 0, dropped: 0 };
  readonly #o: Required<Omit<LogTailOptions, 'clock'>> & { clock: Clock };
  #current: Tracked | null = null;
  #retired: Tracked[] = [];
  #first = true;
  #buf: Buffer;
  #chain: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(o: LogTailOptions) {
    this.#o = {
      startAt: 'end',
      rotateGraceMs: 30_000, // 30 s
      chunkBytes: 4 * 1024 * 1024, // 4 MiB
      maxLineBytes: 16 * 1024, // 16 KiB
      clock: systemClock,
      ...o,
    };
    this.#buf = Buffer.allocUnsafe(this.#o.chunkBytes + this.#o.maxLineBytes);
  }

  /** Read whatever was appended since the last poll. Polls never overlap. */
  poll(): Promise<void> {
    const next = this.#chain.then(() => this.#pollOnce());
    this.#chain = next.catch(() => undefined);
    return next;
  }

  async close(): Promise<void> {
    this.#closed = true;
    await this.#chain;
    for (const t of [...this.#retired, ...(this.#current ? [this.#current] : [])]) await t.fh.close().catch(() => undefined);
    this.#retired = [];
    this.#current = null;
  }

  async #pollOnce(): Promise<void> {
    if (this.#closed) return;
    const now = this.#o.clock.now();
    // 1. What does the path name now?
    const st = await stat(this.#o.path, { bigint: false }).catch(() => null);
    const first = this.#first;
    this.#first = false;
    if (st && (!this.#current || st.ino !== this.#current.ino || st.dev !== this.#current.dev)) {
      if (this.#current) {
        this.#current.retireAt = now + this.#o.rotateGraceMs;
        this.#retired.push(this.#current);
        this.counters.rotations++;
      }
      this.#current = await this.#open(first && this.#o.startAt === 'end');
    }
    // 2. Drain rotated files (Nginx workers may still be writing to them), close the expired.
    for (const t of [...this.#retired]) {
      await this.#drain(t);
      if (t.retireAt !== null && now >= t.retireAt) {
        this.#dropCarry(t);
        await t.fh.close().catch(() => undefined);
        this.#retired.splice(this.#retired.indexOf(t), 1);
      }
    }
    // 3. The current file.
    if (this.#current) await this.#drain(this.#current);
  }

  async #open(atEnd: boolean): Promise<Tracked | null> {
    const fh = await open(this.#o.path, 'r').catch(() => null);
    if (!fh) return null;
    const st = await fh.stat();
    return { fh, dev: st.dev, ino: st.ino, offset: atEnd ? st.size : 0, carry: Buffer.alloc(0), skipping: false, retireAt: null };
  }

  #dropCarry(t: Tracked): void {
    if (t.carry.length > 0 && !t.skipping) this.counters.dropped++;
    t.carry = Buffer.alloc(0);
    t.skipping = false;
  }

  async #drain(t: Tracked): Promise<void> {
    const { size } = await t.fh.stat();
    if (size < t.offset) {
      this.counters.truncations++;
      this.#dropCarry(t);
      t.offset = 0;
    }
    const buf = this.#buf;
    const max = this.#o.maxLineBytes;
    while (t.offset < size) {
      let carryLen = t.carry.length;
      t.carry.copy(buf, 0);
      const want = Math.min(this.#o.chunkBytes, size - t.offset);
      const { bytesRead } = await t.fh.read(buf, carryLen, want, t.offset);
      if (bytesRead === 0) break;
      t.offset += bytesRead;
      this.counters.bytes += bytesRead;
      const end = carryLen + bytesRead;
      let start = 0;
      if (t.skipping) {
        const nl = buf.indexOf(10, 0);
        if (nl < 0 || nl >= end) {
          t.carry = Buffer.alloc(0);
          continue;
        }
        t.skipping = false;
        start = nl + 1;
      }
      const rest = this.#o.consume(buf, start, end);
      carryLen = end - rest;
      if (carryLen > max) {
        // A line with no end in sight: drop it, skip up to its newline.
        this.counters.dropped++;
        t.skipping = true;
        t.carry = Buffer.alloc(0);
      } else {
        t.carry = Buffer.from(buf.subarray(rest, end));
      }
    }
  }
}
