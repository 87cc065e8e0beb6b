// The access-log line parser: `$time_iso8601 $host $status $request_time $dstack_replica_hit`
// (render.ts, log_format dstack_proxy_stat), e.g.
//   2025-01-01T12:00:00+00:00 llama.gw.example.com 200 0.153 1
// One pass over the bytes of a chunk: no regex, no string per line. Only lines whose last field
// is 1 (the request reached the replica location) are counted; 0 and - are parsed and skipped.

import type { FrameTable } from './frames.js';

export interface ParseCounters {
  /** Complete lines seen, malformed included. */
  lines: number;
  malformed: number;
  /** Lines counted into frames. */
  hits: number;
}

export function newParseCounters(): ParseCounters {
  return { lines: 0, malformed: 0, hits: 0 };
}

const NL = 10;
const SP = 32;

/** Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's days_from_civil). */
export function daysFromCivil(y: number, m: number, d: number): number {
  y -= m <= 2 ? 1 : 0;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146097 + doe - 719468;
}

let cachedYmd = -1;
let cachedDays = 0;

/** Two decimal digits at i, or -1. */
function two(b: Uint8Array, i: number): number {
  const a = b[i]! - 48,
    c = b[i + 1]! - 48;
  return a >>> 0 > 9 || c >>> 0 > 9 ? -1 : a * 10 + c;
}

/**
 * Epoch seconds of `YYYY-MM-DDTHH:MM:SS+HH:MM` at b[p] (25 bytes), or -1 when it is not one.
 * The caller guarantees p + 25 <= b.length.
 */
export function parseIsoSeconds(b: Uint8Array, p: number): number {
  if (b[p + 4] !== 45 || b[p + 7] !== 45 || b[p + 10] !== 84 || b[p + 13] !== 58 || b[p + 16] !== 58 || b[p + 22] !== 58) return -1;
  const sign = b[p + 19] === 43 ? 1 : b[p + 19] === 45 ? -1 : 0;
  const yh = two(b, p),
    yl = two(b, p + 2),
    mo = two(b, p + 5),
    d = two(b, p + 8);
  const hh = two(b, p + 11),
    mi = two(b, p + 14),
    ss = two(b, p + 17),
    oh = two(b, p + 20),
    om = two(b, p + 23);
  if (sign === 0 || (yh | yl | mo | d | hh | mi | ss | oh | om) < 0) return -1;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || hh > 23 || mi > 59 || ss > 60) return -1;
  const ymd = (yh * 100 + yl) * 10000 + mo * 100 + d;
  if (ymd !== cachedYmd) {
    cachedDays = daysFromCivil(yh * 100 + yl, mo, d);
    cachedYmd = ymd;
  }
  return cachedDays * 86400 + hh * 3600 + mi * 60 + ss - sign * (oh * 3600 + om * 60);
}

/**
 * Parse the complete lines of b[start, end) into `table`. Returns where the unconsumed rest
 * begins: the start of a last line that has no newline yet (end when every line was complete).
 */
export function parseLines(b: Uint8Array, start: number, end: number, table: FrameTable, c: ParseCounters): number {
  let p = start;
  while (p < end) {
    const lineStart = p;
    // Shortest valid line: 25 (time) + 1 + 1 (host) + 1 + 3 + 1 + 1 (time) + 1 + 1 + 1 (\n) = 36.
    let ok = false;
    let hit = false;
    parse: {
      if (p + 36 > end) break parse;
      const sec = parseIsoSeconds(b, p);
      if (sec < 0 || b[p + 25] !== SP) break parse;
      p += 26;
      // host, hashed while scanning
      const hostStart = p;
      let h = 0x811c9dc5;
      let ch = 0;
      while (p < end && (ch = b[p]!) !== SP && ch !== NL) {
        h = Math.imul(h ^ ch, 0x01000193);
        p++;
      }
      const hostEnd = p;
      // ' ddd ' and at least 'd x\n' must follow, all before `end` (bytes past it are stale).
      if (ch !== SP || hostEnd === hostStart || p + 9 > end) break parse;
      // status: 3 digits
      if ((b[p + 1]! - 48) >>> 0 > 9 || (b[p + 2]! - 48) >>> 0 > 9 || (b[p + 3]! - 48) >>> 0 > 9 || b[p + 4] !== SP) break parse;
      const first = b[p + 1]! - 48;
      const statusClass = first >= 1 && first <= 5 ? first : 0;
      p += 5;
      // request time: digits[.digits], kept as integer milliseconds
      let whole = 0;
      let digits = 0;
      while (p < end && (ch = b[p]! - 48) >>> 0 <= 9) {
        whole = whole * 10 + ch;
        p++;
        digits++;
      }
      if (digits === 0) break parse;
      let ms = whole * 1000;
      if (p >= end) break parse;
      if (b[p] === 46) {
        p++;
        let scale = 100;
        let fd = 0;
        while (p < end && (ch = b[p]! - 48) >>> 0 <= 9) {
          ms += ch * scale;
          scale /= 10;
          p++;
          fd++;
        }
        if (fd === 0) break parse;
      }
      if (p + 2 >= end) break parse;
      if (b[p] !== SP) break parse;
      const flag = b[p + 1];
      if (b[p + 2] !== NL) break parse;
      if (flag === 49) hit = true;
      else if (flag !== 48 && flag !== 45) break parse;
      p += 3;
      ok = true;
      if (hit) {
        table.addBytes(b, hostStart, hostEnd, h >>> 0, sec, Math.round(ms), statusClass);
        c.hits++;
      }
    }
    if (ok) {
      c.lines++;
      continue;
    }
    // Not a valid line (or not complete yet): skip to the next newline, if there is one.
    const nl = indexOfNewline(b, lineStart, end);
    if (nl < 0) return lineStart;
    c.lines++;
    c.malformed++;
    p = nl + 1;
  }
  return p;
}

function indexOfNewline(b: Uint8Array, from: number, end: number): number {
  const i = b.indexOf(NL, from);
  return i < 0 || i >= end ? -1 : i;
}
