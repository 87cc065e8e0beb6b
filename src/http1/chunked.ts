// The chunked transfer coding (RFC 9112 §7.1), decoded strictly and incrementally: bytes go in as
// they arrive, the data pieces come out as subarrays of the input (no copy). Shared by the
// response parser (a replica's chunked answer) and the balancer (a client's chunked upload).
// Strict because both sides of a reused connection must agree where a body ends: a bad size,
// a missing CRLF, a control byte in an extension or a trailer is an error, never a guess.
// Extensions and trailers are checked and dropped.

/** Where the data pieces go (ResponseSink's onBody has this shape; `last` is always false here). */
export interface ChunkedSink {
  onBody(chunk: Buffer, last: boolean): void;
}

// States (numbers, not an enum: cheap comparisons).
const SIZE = 0;
const EXT = 1;
const SIZE_LF = 2;
const DATA = 3;
const DATA_CR = 4;
const DATA_LF = 5;
const TRAILER_START = 6;
const TRAILER_LINE = 7;
const TRAILER_LINE_LF = 8;
const TRAILER_END_LF = 9;
const DONE = 10;

const CR = 13;
const LF = 10;
const MAX_SIZE_DIGITS = 12; // 2^48 bytes: far beyond any body, well inside a safe integer
const MAX_EXT = 4096;

export class ChunkedDecoder {
  /** Why execute() returned -1. */
  error = '';
  #state = SIZE;
  #remaining = 0;
  #digits = 0;
  #extLen = 0;
  #trailerLen = 0;
  readonly #maxTrailerSize: number;

  constructor(maxTrailerSize: number) {
    this.#maxTrailerSize = maxTrailerSize;
  }

  /** Expect a new chunked body. */
  reset(): void {
    this.#state = SIZE;
    this.#remaining = 0;
    this.#digits = 0;
    this.error = '';
  }

  /** The last chunk and the trailers' final CRLF were read. */
  get done(): boolean {
    return this.#state === DONE;
  }

  /**
   * Decodes `chunk` from `from`, handing at most one data piece to `sink` (then returning, so a
   * caller can stop between pieces). Returns the offset reached — `chunk.length`, or the byte
   * after the body's final CRLF once `done` — or -1 with `error` set.
   */
  execute(chunk: Buffer, from: number, sink: ChunkedSink): number {
    let i = from;
    const n = chunk.length;
    while (i < n) {
      const c = chunk[i]!;
      switch (this.#state) {
        case DATA: {
          const take = Math.min(this.#remaining, n - i);
          this.#remaining -= take;
          if (this.#remaining === 0) this.#state = DATA_CR;
          sink.onBody(i === 0 && take === n ? chunk : chunk.subarray(i, i + take), false);
          return i + take;
        }
        case SIZE: {
          const v = hexValue(c);
          if (v !== -1) {
            if (++this.#digits > MAX_SIZE_DIGITS) return this.#fail('chunk size too large');
            this.#remaining = this.#remaining * 16 + v;
          } else if (this.#digits === 0) return this.#fail('invalid chunk size');
          else if (c === CR) this.#state = SIZE_LF;
          else if (c === 0x3b || c === 0x20 || c === 0x09) {
            this.#state = EXT;
            this.#extLen = 0;
          } else return this.#fail('invalid chunk size');
          break;
        }
        case EXT:
          if (c === CR) this.#state = SIZE_LF;
          else if ((c < 0x20 && c !== 0x09) || c === 0x7f) return this.#fail('invalid chunk extension');
          else if (++this.#extLen > MAX_EXT) return this.#fail('chunk extension too long');
          break;
        case SIZE_LF:
          if (c !== LF) return this.#fail('invalid chunk size line');
          if (this.#remaining === 0) {
            this.#state = TRAILER_START;
            this.#trailerLen = 0;
          } else this.#state = DATA;
          break;
        case DATA_CR:
          if (c !== CR) return this.#fail('missing CRLF after chunk data');
          this.#state = DATA_LF;
          break;
        case DATA_LF:
          if (c !== LF) return this.#fail('missing CRLF after chunk data');
          this.#state = SIZE;
          this.#remaining = 0;
          this.#digits = 0;
          break;
        case TRAILER_START:
          if (c === CR) this.#state = TRAILER_END_LF;
          else if (c === LF) return this.#fail('invalid trailer');
          else this.#state = TRAILER_LINE;
          if (++this.#trailerLen > this.#maxTrailerSize) return this.#fail('trailers too large');
          break;
        case TRAILER_LINE:
          if (c === CR) this.#state = TRAILER_LINE_LF;
          else if ((c < 0x20 && c !== 0x09) || c === 0x7f) return this.#fail('invalid trailer');
          if (++this.#trailerLen > this.#maxTrailerSize) return this.#fail('trailers too large');
          break;
        case TRAILER_LINE_LF:
          if (c !== LF) return this.#fail('invalid trailer');
          this.#state = TRAILER_START;
          break;
        case TRAILER_END_LF:
          if (c !== LF) return this.#fail('invalid trailer');
          this.#state = DONE;
          return i + 1;
        default:
          return i; // DONE: nothing more belongs to this body
      }
      i++;
    }
    return i;
  }

  #fail(reason: string): number {
    this.error = reason;
    return -1;
  }
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  const l = c | 0x20;
  if (l >= 0x61 && l <= 0x66) return l - 0x61 + 10;
  return -1;
}
