// The chunked decoder alone: every split of the input gives the same data, and bad framing is
// refused wherever it is.

import { describe, expect, it } from 'vitest';
import { ChunkedDecoder } from '../../src/http1/chunked.js';

/** Decodes `input` fed in the given pieces: the data, the offset after the body in the last piece, or the error. */
function decode(pieces: Buffer[]): { data: string; end: number; error: string; done: boolean } {
  const dec = new ChunkedDecoder(1024);
  const out: Buffer[] = [];
  const sink = { onBody: (b: Buffer) => void out.push(Buffer.from(b)) };
  let end = 0;
  for (const p of pieces) {
    let i = 0;
    while (i < p.length && !dec.done) {
      i = dec.execute(p, i, sink);
      if (i === -1) return { data: Buffer.concat(out).toString(), end: -1, error: dec.error, done: false };
    }
    end = i;
  }
  return { data: Buffer.concat(out).toString(), end, error: '', done: dec.done };
}

const BODY = '5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: 1\r\n\r\n';

describe('ChunkedDecoder', () => {
  it('decodes the same data whatever the split, and stops right after the body', () => {
    const all = Buffer.from(`${BODY}NEXT`);
    for (let cut = 0; cut <= all.length; cut++) {
      const r = decode([all.subarray(0, cut), all.subarray(cut)]);
      expect(r.done).toBe(true);
      expect(r.data).toBe('helloabcdefghijklmnopqrstuvwxyz');
      if (cut <= BODY.length) expect(r.end).toBe(BODY.length - cut);
    }
    const bytes = [...Buffer.from(BODY)].map((c) => Buffer.from([c]));
    expect(decode(bytes)).toMatchObject({ done: true, data: 'helloabcdefghijklmnopqrstuvwxyz' });
  });

  it.each([
    ['no size', '\r\n'],
    ['not hex', 'zz\r\n'],
    ['bare LF after size', '5\nhello\r\n0\r\n\r\n'],
    ['no CRLF after data', '5\r\nhelloX\r\n0\r\n\r\n'],
    ['control byte in extension', '5;a\x01\r\nhello\r\n'],
    ['size too large', '1000000000000\r\n'],
    ['bare LF in trailers', '0\r\nX: 1\n\r\n'],
  ])('refuses %s', (_name, text) => {
    const r = decode([Buffer.from(text)]);
    expect(r.end).toBe(-1);
    expect(r.error).not.toBe('');
  });

  it('refuses trailers beyond the limit', () => {
    const r = decode([Buffer.from(`0\r\nX: ${'x'.repeat(2000)}\r\n\r\n`)]);
    expect(r.error).toBe('trailers too large');
  });
});
