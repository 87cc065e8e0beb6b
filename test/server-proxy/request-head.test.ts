// The fast path's request-head parser on its own: what a valid head yields, when more bytes are
// needed, and every strictness rule that keeps a request we might read differently from Node (or
// from the replica) off the fast path.

import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { parseRequestHead, type HeadResult, type RequestHead } from '../../src/http1/request-head.js';

const MAX = 8192;

function parse(text: string, from = 0, max = MAX): HeadResult {
  return parseRequestHead(Buffer.from(text, 'latin1'), from, max);
}

/** The head of `text`, which must be valid. */
function head(text: string, from = 0): RequestHead {
  const r = parse(text, from);
  if (r.kind !== 'head') throw new Error(`expected a head, got ${JSON.stringify(r)}`);
  return r.head;
}

describe('valid heads', () => {
  it('what wrk sends', () => {
    const text = 'GET /path HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n';
    expect(parse(text)).toEqual({
      kind: 'head',
      head: {
        method: 'GET',
        target: '/path',
        minor: 1,
        rawHeaders: ['Host', '127.0.0.1:8080'],
        contentLength: -1,
        transferEncoding: false,
        host: '127.0.0.1:8080',
        keepAlive: true,
        expect: false,
        upgrade: false,
        size: text.length,
      },
    });
  });

  it('values trimmed of SP and HTAB only, order and name case kept, empty values allowed', () => {
    const h = head(
      'POST /a?b=c%20d HTTP/1.1\r\nhOST:x\r\nX-A:  \t v  w \t\r\nX-Empty:\r\nX-Blank: \t \r\nx-a:2\r\nContent-Length: 0\r\n\r\n',
    );
    expect(h.rawHeaders).toEqual(['hOST', 'x', 'X-A', 'v  w', 'X-Empty', '', 'X-Blank', '', 'x-a', '2', 'Content-Length', '0']);
    expect(h).toMatchObject({ method: 'POST', target: '/a?b=c%20d', host: 'x', contentLength: 0 });
  });

  it('bytes after the head are never read: size counts the head only', () => {
    const first = 'POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n';
    const withBody = head(`${first}hello`);
    expect(withBody).toMatchObject({ size: first.length, contentLength: 5 });
    const pipelined = head(`${first}helloGET /next HTTP/1.1\r\nHost: other\r\nConnection: close\r\n\r\n`);
    expect(pipelined).toMatchObject({ size: first.length, host: 'h', keepAlive: true, target: '/up' });
    // Garbage after the head is the next request's problem, not this one's.
    expect(head('GET / HTTP/1.1\r\nHost: h\r\n\r\n\x00\n\r junk').size).toBe(27);
  });

  it('from > 0: a head after the previous request in the same buffer', () => {
    const prev = 'GET /one HTTP/1.1\r\nHost: a\r\n\r\n';
    const next = 'GET /two HTTP/1.0\r\nX-Y: z\r\n\r\n';
    const h = head(prev + next, prev.length);
    expect(h).toMatchObject({ target: '/two', minor: 0, host: undefined, size: next.length, rawHeaders: ['X-Y', 'z'] });
    // The previous request's bytes count toward neither the size nor the limit.
    expect(parse(prev + next, prev.length, next.length).kind).toBe('head');
    expect(parse(prev + next, prev.length, next.length - 1)).toMatchObject({ kind: 'error', status: 431 });
  });

  it.each([
    [
      'repeated equal Content-Length',
      'PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\ncontent-length: 12\r\n\r\n',
      { contentLength: 12 },
    ],
    ['leading zeros in Content-Length', 'PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\n', { contentLength: 7 }],
    [
      '15-digit Content-Length',
      'PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 999999999999999\r\n\r\n',
      { contentLength: 999999999999999 },
    ],
    ['chunked', 'POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n', { transferEncoding: true, contentLength: -1 }],
    [
      'codings ending in chunked, any case, OWS',
      'POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip ,\tChunked \r\n\r\n',
      { transferEncoding: true },
    ],
    [
      'chunked in a second Transfer-Encoding header',
      'POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n',
      { transferEncoding: true },
    ],
    ['HTTP/1.0 without Host', 'GET / HTTP/1.0\r\n\r\n', { minor: 0, host: undefined, rawHeaders: [] }],
    ['empty Host', 'GET / HTTP/1.1\r\nHost:\r\n\r\n', { host: '' }],
    ['OPTIONS *', 'OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n', { method: 'OPTIONS', target: '*' }],
    [
      'any token method, any visible target bytes',
      'M-1!#$%&\'*+.^_`|~ /a/%ZZ/"<>{}\x80\xff HTTP/1.1\r\nHost: h\r\n\r\n',
      { method: "M-1!#$%&'*+.^_`|~", target: '/a/%ZZ/"<>{}\x80\xff' },
    ],
    [
      '0x80-0xFF and HTAB in values',
      'GET / HTTP/1.1\r\nHost: h\r\nX-Name: caf\xe9\tna\xefve \xa0\xff\r\n\r\n',
      { rawHeaders: ['Host', 'h', 'X-Name', 'caf\xe9\tna\xefve \xa0\xff'] },
    ],
    [
      'a colon in a value',
      'GET / HTTP/1.1\r\nHost: h:80\r\nX-T: a:b: c\r\n\r\n',
      { host: 'h:80', rawHeaders: ['Host', 'h:80', 'X-T', 'a:b: c'] },
    ],
  ])('%s', (_name, text, expected) => {
    expect(head(text)).toMatchObject({ ...expected, size: text.length });
  });
});

describe('keepAlive, expect, upgrade', () => {
  it.each([
    ['1.1 by default', 'HTTP/1.1', [], true],
    ['1.1 close', 'HTTP/1.1', ['Connection: close'], false],
    ['1.1 CLOSE, any case', 'HTTP/1.1', ['connection: CLOSE'], false],
    ['1.1 foo, close', 'HTTP/1.1', ['Connection: foo, close'], false],
    ['1.1 close in a second header', 'HTTP/1.1', ['Connection: foo', 'Connection: \tclose\t'], false],
    ['1.1 not a close token', 'HTTP/1.1', ['Connection: closed, xclose'], true],
    ['1.1 upgrade', 'HTTP/1.1', ['Connection: upgrade'], true],
    ['1.0 by default', 'HTTP/1.0', [], false],
    ['1.0 Keep-Alive', 'HTTP/1.0', ['Connection: Keep-Alive'], true],
    ['1.0 foo , keep-alive ,bar', 'HTTP/1.0', ['Connection: foo , keep-alive ,bar'], true],
    ['1.0 keep-alive and close: close wins', 'HTTP/1.0', ['Connection: keep-alive, close'], false],
    ['1.0 close', 'HTTP/1.0', ['Connection: close'], false],
    ['1.0 upgrade', 'HTTP/1.0', ['Connection: upgrade'], false],
  ])('%s', (_name, version, lines, keepAlive) => {
    const text = `GET / ${version}\r\nHost: h\r\n${lines.map((l) => `${l}\r\n`).join('')}\r\n`;
    expect(head(text).keepAlive).toBe(keepAlive);
  });

  it.each([
    ['none', [], { expect: false, upgrade: false }],
    ['Expect', ['Expect: 100-continue'], { expect: true, upgrade: false }],
    ['Expect, any case, empty value', ['EXPECT:'], { expect: true }],
    ['Upgrade header', ['Upgrade: websocket'], { expect: false, upgrade: true }],
    ['Connection: Upgrade', ['Connection: keep-alive, Upgrade'], { upgrade: true, keepAlive: true }],
    ['Connection: upgraded is not upgrade', ['Connection: upgraded'], { upgrade: false }],
  ])('%s', (_name, lines, expected) => {
    expect(head(`GET /ws HTTP/1.1\r\nHost: h\r\n${lines.map((l) => `${l}\r\n`).join('')}\r\n`)).toMatchObject(expected);
  });
});

describe('incomplete and too large', () => {
  const text = 'GET /path HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-A: b\r\n\r\n';

  it('every proper prefix of a head is incomplete, including a partial CRLFCRLF', () => {
    for (let i = 0; i < text.length; i++) expect(parse(text.slice(0, i)), JSON.stringify(text.slice(0, i))).toEqual({ kind: 'incomplete' });
    expect(parse('GET / HTTP/1.1\r\nHost: h\r\n\r')).toEqual({ kind: 'incomplete' });
    expect(parse('GET / HTTP/1.1\r\nHost: h\r\n\r', 0, 27)).toEqual({ kind: 'incomplete' });
    expect(parse('GET /a HTTP/1.1\r\n', 17)).toEqual({ kind: 'incomplete' }); // nothing yet at `from`
  });

  it('a head exactly maxSize long passes; one byte more is a 431', () => {
    expect(parse(text, 0, text.length).kind).toBe('head');
    expect(parse(text, 0, text.length - 1)).toMatchObject({ kind: 'error', status: 431 });
    expect(parse(`${text}body bytes beyond the limit`, 0, text.length).kind).toBe('head');
  });

  it('no end of head within maxSize is a 431, at once', () => {
    const partial = `GET / HTTP/1.1\r\nX-Big: ${'a'.repeat(100)}`;
    expect(parse(partial, 0, partial.length)).toEqual({ kind: 'incomplete' });
    expect(parse(partial, 0, partial.length - 1)).toMatchObject({ kind: 'error', status: 431 });
  });

  it('256 header lines pass, 257 are a 431', () => {
    const lines = (n: number): string => `GET / HTTP/1.1\r\nHost: h\r\n${'X-A: 1\r\n'.repeat(n - 1)}\r\n`;
    expect(head(lines(256)).rawHeaders).toHaveLength(512);
    expect(parse(lines(257))).toMatchObject({ kind: 'error', status: 431 });
  });

  it('a bare LF or CR is refused before the head is complete (an LF-only client would wait forever)', () => {
    expect(parse('GET / HTTP/1.1\nHost: h\n\n')).toMatchObject({ kind: 'error', status: 400 });
    expect(parse('\nGET /')).toMatchObject({ kind: 'error', status: 400 });
    expect(parse('GET / HTTP/1.1\r\nX: a\rb')).toMatchObject({ kind: 'error', status: 400 });
    expect(parse('GET / HTTP/1.1\r')).toEqual({ kind: 'incomplete' }); // the LF may still come
  });
});

const INVALID: [string, string, 400 | 501 | 505, RegExp][] = [
  // 1. The request line.
  ['leading empty line', '\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['empty head', '\r\n\r\n', 400, /request line/],
  ['bad method character', 'GE(T / HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['method with a non-ASCII byte', 'G\xc9T / HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['no method', ' / HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['two spaces after the method', 'GET  / HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['two spaces before the version', 'GET /  HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['space in the target', 'GET /a b HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['HTAB in the target', 'GET /a\tb HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['NUL in the target', 'GET /a\x00b HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['DEL in the target', 'GET /a\x7fb HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['HTTP/0.9 style, no version', 'GET /\r\nHost: h\r\n\r\n', 400, /request line/],
  ['HTTP/2.0', 'GET / HTTP/2.0\r\nHost: h\r\n\r\n', 505, /version/],
  ['HTTP/1.2', 'GET / HTTP/1.2\r\nHost: h\r\n\r\n', 505, /version/],
  ['HTTP/0.9', 'GET / HTTP/0.9\r\nHost: h\r\n\r\n', 505, /version/],
  ['garbage version', 'GET / FOO/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['lower-case http', 'GET / http/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['HTTP/1.10', 'GET / HTTP/1.10\r\nHost: h\r\n\r\n', 400, /request line/],
  ['HTTP/1', 'GET / HTTP/1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['trailing space after the version', 'GET / HTTP/1.1 \r\nHost: h\r\n\r\n', 400, /request line/],
  ['CONNECT', 'CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n', 501, /CONNECT/],
  ['absolute-form', 'GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n', 400, /origin form/],
  ['authority-form with GET', 'GET example.com:80 HTTP/1.1\r\nHost: example.com\r\n\r\n', 400, /origin form/],
  ['* with GET', 'GET * HTTP/1.1\r\nHost: h\r\n\r\n', 400, /origin form/],
  // 2. Line endings.
  ['bare LF ending the request line', 'GET / HTTP/1.1\nHost: h\r\n\r\n', 400, /request line/],
  ['bare LF inside a value', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\nX-B: 2\r\n\r\n', 400, /header line/],
  ['bare LF before the final CRLFCRLF', 'GET / HTTP/1.1\r\nHost: h\n\r\n\r\n', 400, /header line/],
  ['bare CR inside a value', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\rX-B: 2\r\n\r\n', 400, /header line/],
  ['bare CR in the request line', 'GET /\r HTTP/1.1\r\nHost: h\r\n\r\n', 400, /request line/],
  ['bare CR before the final CRLFCRLF', 'GET / HTTP/1.1\r\nHost: h\r\r\n\r\n', 400, /header line/],
  // 3. Header lines.
  ['obs-fold with SP', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\n\r\n', 400, /header line/],
  ['obs-fold with HTAB', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\t2\r\n\r\n', 400, /header line/],
  ['space before the colon', 'GET / HTTP/1.1\r\nHost : h\r\n\r\n', 400, /header line/],
  ['HTAB before the colon', 'GET / HTTP/1.1\r\nHost\t: h\r\n\r\n', 400, /header line/],
  ['no colon', 'GET / HTTP/1.1\r\nHost: h\r\nX-Broken\r\n\r\n', 400, /header line/],
  ['empty name', 'GET / HTTP/1.1\r\nHost: h\r\n: v\r\n\r\n', 400, /header line/],
  ['non-token name', 'GET / HTTP/1.1\r\nHost: h\r\nX(A): v\r\n\r\n', 400, /header line/],
  ['NUL in a value', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n', 400, /header line/],
  ['other CTL in a value', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n', 400, /header line/],
  ['DEL in a value', 'GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x7fb\r\n\r\n', 400, /header line/],
  // 4. Content-Length.
  ['non-digit Content-Length', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n', 400, /Content-Length/],
  ['negative Content-Length', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n', 400, /Content-Length/],
  ['empty Content-Length', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n', 400, /Content-Length/],
  ['16-digit Content-Length', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000000000000\r\n\r\n', 400, /Content-Length/],
  ['Content-Length with an inner space', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1 2\r\n\r\n', 400, /Content-Length/],
  ['conflicting Content-Length', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\n', 400, /conflicting/],
  ['Content-Length list', 'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n', 400, /Content-Length/],
  // 5. Transfer-Encoding.
  [
    'Transfer-Encoding and Content-Length',
    'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n',
    400,
    /both/,
  ],
  [
    'Content-Length and Transfer-Encoding',
    'POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\ntransfer-encoding: chunked\r\n\r\n',
    400,
    /both/,
  ],
  ['Transfer-Encoding in HTTP/1.0', 'POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n', 400, /HTTP\/1\.0/],
  ['Transfer-Encoding not ending in chunked', 'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n', 400, /chunked/],
  ['Transfer-Encoding: gzip', 'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n', 400, /chunked/],
  [
    'Transfer-Encoding: chunked then a second header',
    'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n',
    400,
    /chunked/,
  ],
  ['Transfer-Encoding with a trailing comma', 'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked,\r\n\r\n', 400, /chunked/],
  ['Transfer-Encoding: xchunked', 'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n', 400, /chunked/],
  [
    'Transfer-Encoding: chunked with NBSP (not OWS)',
    'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\xa0\r\n\r\n',
    400,
    /chunked/,
  ],
  ['empty Transfer-Encoding', 'POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n', 400, /chunked/],
  // 6. Host.
  ['HTTP/1.1 without Host', 'GET / HTTP/1.1\r\nX-A: b\r\n\r\n', 400, /Host/],
  ['HTTP/1.1 with no headers at all', 'GET / HTTP/1.1\r\n\r\n', 400, /Host/],
  ['two Host headers', 'GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n', 400, /Host/],
  ['two equal Host headers', 'GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n', 400, /Host/],
  ['two Host headers in HTTP/1.0', 'GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n', 400, /Host/],
];

describe('invalid heads', () => {
  it.each(INVALID)('%s', (_name, text, status, reason) => {
    const r = parse(text);
    expect(r).toMatchObject({ kind: 'error', status });
    if (r.kind === 'error') expect(r.reason).toMatch(reason);
  });

  it('random bytes never throw (2000 inputs, alone and after a valid request line)', () => {
    for (let i = 0; i < 2000; i++) {
      const noise = randomBytes(1 + (i % 300)).toString('latin1');
      for (const prefix of ['', 'GET / HTTP/1.1\r\n', 'GET / HTTP/1.1\r\nHost: h\r\nConnection: ']) {
        expect(() => parse(`${prefix}${noise}\r\n\r\n`)).not.toThrow();
        expect(() => parse(`${prefix}${noise}`, 0, 64)).not.toThrow();
      }
    }
  });
});
