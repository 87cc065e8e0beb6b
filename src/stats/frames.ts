// Per-host request frames: one slot per second for the last 300 s, in a ring, plus running
// totals for metrics. Hosts are found by the bytes of their name (the log parser never makes
// a string per line) or by name (collect, the in-server proxy).

export const WINDOWS = [30, 60, 300] as const;
export type WindowSec = (typeof WINDOWS)[number];
/** The ring covers the largest window. */
export const FRAME_SLOTS = 300;
/** Hosts tracked at most; lines for further hosts are counted as dropped. */
export const DEFAULT_MAX_HOSTS = 100_000;

export interface WindowStat {
  requests: number;
  /** Mean request time in seconds over the window; 0 without requests. */
  request_time: number;
}

export type WindowStats = Record<`${WindowSec}`, WindowStat>;

/** One entry of dstack's stats answer. */
export interface ServiceStats {
  project_name: string;
  run_name: string;
  stats: WindowStats;
}

/** FNV-1a over bytes [start, end). */
export function hashBytes(buf: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) h = Math.imul(h ^ buf[i]!, 0x01000193);
  return h >>> 0;
}

/** Frame seconds are stored relative to this (2020-01-01T00:00:00Z) to fit an Int32. */
const EPOCH_BASE = 1_577_836_800;
const INT32_MAX = 0x7fffffff;

export class HostFrames {
  readonly name: string;
  readonly bytes: Buffer;
  readonly hash: number;
  /**
   * The ring, interleaved for one sequential read per collect: slot i holds
   * [second - EPOCH_BASE (-1 = empty), requests, request time in ms (saturating)] at 3i.
   */
  readonly ring = new Int32Array(FRAME_SLOTS * 3);
  totalRequests = 0;
  totalTimeMs = 0;
  /** Requests by the status's first digit (index 1-5; 0: anything else), since the start. */
  readonly byClass = new Float64Array(6);
  /** Newest second seen, for pruning. */
  lastSec = -1;

  constructor(name: string, hash: number) {
    this.name = name;
    this.bytes = Buffer.from(name, 'latin1');
    this.hash = hash;
    for (let i = 0; i < FRAME_SLOTS; i++) this.ring[i * 3] = -1;
  }

  add(sec: number, ms: number, statusClass = 0): void {
    this.totalRequests++;
    this.totalTimeMs += ms;
    this.byClass[statusClass]!++;
    if (sec > this.lastSec) this.lastSec = sec;
    const rel = sec - EPOCH_BASE;
    if (rel < 0) return; // before 2020: a broken clock, outside every window
    const at = (sec % FRAME_SLOTS) * 3;
    const ring = this.ring;
    const held = ring[at]!;
    if (held !== rel) {
      if (held > rel) return; // older than the ring: outside every window
      ring[at] = rel;
      ring[at + 1] = 0;
      ring[at + 2] = 0;
    }
    ring[at + 1]!++;
    ring[at + 2] = Math.min(INT32_MAX, ring[at + 2]! + ms);
  }

  /** The 30/60/300 s windows ending at `nowSec`: seconds in (nowSec - W, nowSec]. */
  windows(nowSec: number): WindowStats {
    if (nowSec - this.lastSec >= FRAME_SLOTS) return emptyWindows();
    const ring = this.ring;
    const now = nowSec - EPOCH_BASE;
    let r30 = 0,
      t30 = 0,
      r60 = 0,
      t60 = 0,
      r = 0,
      t = 0;
    for (let at = 0; at < FRAME_SLOTS * 3; at += 3) {
      const age = now - ring[at]!;
      if (age < 0 || age >= FRAME_SLOTS) continue; // empty, stale, or from the future
      const c = ring[at + 1]!,
        ms = ring[at + 2]!;
      r += c;
      t += ms;
      if (age < 60) {
        r60 += c;
        t60 += ms;
        if (age < 30) {
          r30 += c;
          t30 += ms;
        }
      }
    }
    return { '30': stat(r30, t30), '60': stat(r60, t60), '300': stat(r, t) };
  }
}

/** The mean in seconds, rounded to the millisecond as dstack's gateway reports it. */
function stat(requests: number, timeMs: number): WindowStat {
  return { requests, request_time: requests === 0 ? 0 : Math.round(timeMs / requests) / 1000 };
}

export function emptyWindows(): WindowStats {
  return { '30': stat(0, 0), '60': stat(0, 0), '300': stat(0, 0) };
}

/** Every host's frames, by name bytes (open addressing over the name hash) and by name. */
export class FrameTable {
  /** Slot → host index + 1 (0 = empty); size a power of two, at most half full. */
  #slots = new Int32Array(1024);
  #hosts: HostFrames[] = [];
  readonly #byName = new Map<string, HostFrames>();
  readonly #maxHosts: number;
  /** Lines for a host beyond maxHosts. */
  dropped = 0;

  constructor(maxHosts = DEFAULT_MAX_HOSTS) {
    this.#maxHosts = maxHosts;
  }

  get size(): number {
    return this.#byName.size;
  }

  /** Count one request of the host named by buf[start, end) (hash = hashBytes of it). */
  /** `statusClass`: the status's first digit, 1-5, or 0 for anything else. */
  addBytes(buf: Uint8Array, start: number, end: number, hash: number, sec: number, ms: number, statusClass: number): void {
    const slots = this.#slots;
    const mask = slots.length - 1;
    const len = end - start;
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const idx = slots[i]!;
      if (idx === 0) break;
      const h = this.#hosts[idx - 1]!;
      if (h.hash !== hash || h.bytes.length !== len) continue;
      const nb = h.bytes;
      let j = 0;
      while (j < len && nb[j] === buf[start + j]) j++;
      if (j === len) {
        h.add(sec, ms, statusClass);
        return;
      }
    }
    this.#insert(Buffer.from(buf.buffer, buf.byteOffset + start, len).toString('latin1'), hash)?.add(sec, ms, statusClass);
  }

  /** Count one request of `host` (lower-case), e.g. from the in-server proxy. */
  add(host: string, sec: number, ms: number, statusClass = 0): void {
    const h = this.#byName.get(host) ?? this.#insert(host, hashBytes(Buffer.from(host, 'latin1'), 0, Buffer.byteLength(host, 'latin1')));
    h?.add(sec, ms, statusClass);
  }

  get(host: string): HostFrames | undefined {
    return this.#byName.get(host);
  }

  hosts(): IterableIterator<HostFrames> {
    return this.#byName.values();
  }

  /**
   * dstack's stats answer: the windows of every service `keyOf` names (zeros when idle), in the
   * document's order; a service it names undefined is left out. The frames of every other key
   * are pruned, so a departed service stops holding memory once its last window has passed.
   */
  serviceStats<S extends { project: string; run: string }>(
    services: readonly S[],
    keyOf: (s: S) => string | undefined,
    nowSec: number,
  ): ServiceStats[] {
    const out: ServiceStats[] = [];
    const keep = new Set<string>();
    for (const s of services) {
      const key = keyOf(s);
      if (key === undefined) continue;
      keep.add(key);
      const h = this.#byName.get(key);
      out.push({ project_name: s.project, run_name: s.run, stats: h ? h.windows(nowSec) : emptyWindows() });
    }
    this.prune(keep, nowSec);
    return out;
  }

  /** Forget hosts not in `keep` whose newest frame is older than every window. */
  prune(keep: ReadonlySet<string>, nowSec: number): void {
    let removed = 0;
    for (const h of this.#byName.values()) {
      if (keep.has(h.name) || nowSec - h.lastSec < FRAME_SLOTS) continue;
      this.#byName.delete(h.name);
      removed++;
    }
    if (removed > 0) this.#rebuild(this.#slots.length);
  }

  /** Re-index every host in #byName into a table of `size` slots. */
  #rebuild(size: number): void {
    this.#slots = new Int32Array(size);
    this.#hosts = [];
    for (const h of this.#byName.values()) this.#place(h);
  }

  #place(h: HostFrames): void {
    this.#hosts.push(h);
    const mask = this.#slots.length - 1;
    let i = h.hash & mask;
    while (this.#slots[i] !== 0) i = (i + 1) & mask;
    this.#slots[i] = this.#hosts.length;
  }

  #insert(name: string, hash: number): HostFrames | null {
    const known = this.#byName.get(name);
    if (known) return known;
    if (this.#byName.size >= this.#maxHosts) {
      this.dropped++;
      return null;
    }
    const h = new HostFrames(name, hash);
    this.#byName.set(name, h);
    if ((this.#byName.size + 1) * 2 > this.#slots.length) this.#rebuild(this.#slots.length * 2);
    else this.#place(h);
    return h;
  }
}
