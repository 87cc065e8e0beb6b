// The upstream response parser on its own: every framing, split at every byte, and adversarial
// input that must end in an error (the proxy's 502), never an exception or a desynchronised
// connection.

import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ResponseParser, type ResponseSink } from '../../src/http1/parser.js';

interface Parsed {
  status?: number;
  reason?: string;
  headers?: string[];
  body: string;
  ended: boolean;
  error?: string;
  keepAlive: boolean;
  received: boolean;
}

/** Feed `chunks`, then (when `eof`) the connection's end. */
function parse(chunks: (string | Buffer)[], o: { head?: boolean; eof?: boolean; max?: number } = {}): Parsed {
  const out: Parsed = { body: '', ended: false, keepAlive: false, received: false };
  const sink: ResponseSink = {
    onHead(status, reason, headers) {
      expect(out.status).toBeUndefined();
      Object.assign(out, { status, reason, headers });
    },
    onBody(chunk) {
      expect(out.ended).toBe(false);
      out.body += chunk.toString('latin1');
    },
    onEnd() {
      expect(out.ended).toBe(false);
      out.ended = true;
    },
  };
  const p = new ResponseParser(o.max);
  p.start(sink, o.head ?? false);
  for (const c of chunks) {
    const err = p.execute(typeof c === 'string' ? Buffer.from(c, 'latin1') : c);
    if (err) {
      out.error = err.message;
      return out;
    }
  }
  if (o.eof) {
    const err = p.finish();
    if (err) out.error = err.message;
  }
  out.keepAlive = p.keepAlive;
  out.received = p.received;
  return out;
}

/** Every way of cutting `text` in two, and byte by byte: all must parse like the whole. */
function splits(text: string): string[][] {
  const out: string[][] = [[text], text.split('')];
  for (let i = 1; i < text.length; i++) out.push([text.slice(0, i), text.slice(i)]);
  return out;
}

const VALID: [string, string, { head?: boolean; eof?: boolean }, Partial<Parsed>][] = [
  [
    'content-length',
    'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello',
    {},
    { status: 200, reason: 'OK', body: 'hello', keepAlive: true, headers: ['Content-Type', 'text/plain', 'Content-Length', '5'] },
  ],
  [
    'no reason phrase, OWS trimmed',
    'HTTP/1.1 404\r\nX-A:  \t v  \t\r\nContent-Length:0\r\n\r\n',
    {},
    { status: 404, reason: '', body: '', keepAlive: true, headers: ['X-A', 'v', 'Content-Length', '0'] },
  ],
  [
    'chunked with extensions and trailers',
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\nA \r\n, world!!!\r\n0\r\nX-Trailer: 1\r\n\r\n',
    {},
    { body: 'hello, world!!!', keepAlive: true },
  ],
  [
    'chunked, upper-case hex, empty trailers',
    'HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, CHUNKED\r\n\r\n1F\r\n0123456789012345678901234567890\r\n0\r\n\r\n',
    {},
    { body: '0123456789012345678901234567890', keepAlive: true },
  ],
  [
    'until close',
    'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nstream until the end',
    { eof: true },
    { body: 'stream until the end', keepAlive: false },
  ],
  [
    'unknown transfer coding: until close',
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabcdef',
    { eof: true },
    { body: 'abcdef', keepAlive: false },
  ],
  [
    'HEAD has no body whatever the length',
    'HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n',
    { head: true },
    { status: 200, body: '', keepAlive: true },
  ],
  ['204', 'HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n', {}, { status: 204, body: '', keepAlive: true }],
  ['304', 'HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n', {}, { status: 304, body: '', keepAlive: true }],
  [
    '100 and 103 skipped',
    'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok',
    {},
    { status: 201, body: 'ok', headers: ['Content-Length', '2'] },
  ],
  ['Connection: close', 'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx', {}, { body: 'x', keepAlive: false }],
  ['HTTP/1.0 closes by default', 'HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx', {}, { keepAlive: false }],
  ['HTTP/1.0 with keep-alive', 'HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx', {}, { keepAlive: true }],
  [
    'repeated equal Content-Length',
    'HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab',
    {},
    { body: 'ab', keepAlive: true },
  ],
  [
    'latin1 bytes in values',
    'HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\nContent-Length: 0\r\n\r\n',
    {},
    { headers: ['X-Name', 'caf\xe9', 'Content-Length', '0'] },
  ],
];

describe('valid responses', () => {
  it.each(VALID)('%s, whole, in two at every byte, and byte by byte', (_name, text, o, expected) => {
    for (const chunks of splits(text)) {
      const r = parse(chunks, o);
      expect(r.error).toBeUndefined();
      expect(r).toMatchObject({ ...expected, ended: true });
    }
  });

  it.each([
    ['with the head', ['HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n'], false],
    ['in a later read', ['HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nx', 'yzHTTP/1.1 200 OK\r\n'], true],
    ['after a chunked body', ['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n'], true],
    ['after a 204', ['HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n'], false],
    ['after Content-Length: 0', ['HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nx'], false],
  ] as const)(
    'a body longer than declared (%s) is an error, not a complete response; before the head when it came with it',
    (_name, chunks, headSeen) => {
      const r = parse([...chunks]);
      expect(r.error).toMatch(/longer than|bytes after/);
      expect(r.ended).toBe(false);
      expect(r.status !== undefined).toBe(headSeen);
    },
  );

  it('hands over the length it frames by: Content-Length, -1 for chunked and until-close, the declared one for HEAD', () => {
    const lengthOf = (text: string, head = false): number => {
      let got = -2;
      const p = new ResponseParser();
      p.start({ onHead: (_s, _r, _h, n) => (got = n), onBody: () => undefined, onEnd: () => undefined }, head);
      expect(p.execute(Buffer.from(text, 'latin1'))).toBeNull();
      return got;
    };
    expect(lengthOf('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok')).toBe(2);
    expect(lengthOf('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n')).toBe(0);
    expect(lengthOf('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n')).toBe(-1);
    expect(lengthOf('HTTP/1.1 200 OK\r\n\r\nuntil close')).toBe(-1);
    expect(lengthOf('HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n', true)).toBe(42);
    expect(lengthOf('HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n')).toBe(-1);
  });

  it('parses a second response after start() again', () => {
    const p = new ResponseParser();
    const bodies: string[] = [];
    const sink: ResponseSink = { onHead: () => undefined, onBody: (c) => bodies.push(c.toString()), onEnd: () => bodies.push('|') };
    for (const body of ['one', 'two']) {
      p.start(sink, false);
      expect(p.execute(Buffer.from(`HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n${body}`))).toBeNull();
      expect(p.keepAlive).toBe(true);
    }
    expect(bodies.join('')).toBe('one|two|');
  });

  it('a 1 MiB chunked body in 1000-byte pieces arrives intact', () => {
    const data = randomBytes(1024 * 1024).toString('latin1');
    let wire = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n';
    for (let i = 0; i < data.length; i += 4096) {
      const piece = data.slice(i, i + 4096);
      wire += `${piece.length.toString(16)}\r\n${piece}\r\n`;
    }
    wire += '0\r\n\r\n';
    const chunks: string[] = [];
    for (let i = 0; i < wire.length; i += 1000) chunks.push(wire.slice(i, i + 1000));
    const r = parse(chunks);
    expect(r.ended).toBe(true);
    expect(r.body === data).toBe(true);
  });
});

const INVALID: [string, string][] = [
  ['HTTP/2 status line', 'HTTP/2 200 OK\r\n\r\n'],
  ['four-digit status', 'HTTP/1.1 2000 OK\r\n\r\n'],
  ['status below 100', 'HTTP/1.1 099 Hm\r\n\r\n'],
  ['no space after version', 'HTTP/1.1200 OK\r\n\r\n'],
  ['garbage', 'SSH-2.0-OpenSSH_9.6\r\n\r\n'],
  ['control character in the reason', 'HTTP/1.1 200 O\x01K\r\n\r\n'],
  ['header without colon', 'HTTP/1.1 200 OK\r\nX-Broken\r\n\r\n'],
  ['space before the colon', 'HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx'],
  ['obsolete line folding', 'HTTP/1.1 200 OK\r\nX-A: 1\r\n  2\r\nContent-Length: 0\r\n\r\n'],
  ['bare LF inside a value', 'HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\n\r\n'],
  ['NUL in a value', 'HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n'],
  ['non-numeric Content-Length', 'HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n'],
  ['negative Content-Length', 'HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n'],
  ['Content-Length list', 'HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n'],
  ['conflicting Content-Length', 'HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx'],
  [
    'both Transfer-Encoding and Content-Length',
    'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n',
  ],
  ['an unknown transfer coding with a Content-Length', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc'],
  ['101 without asking', 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n'],
  ['chunk size not hex', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n'],
  ['empty chunk size', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\nab\r\n'],
  ['negative chunk size', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n'],
  ['chunk size overflow', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000\r\n'],
  ['chunk size line with bare LF', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nab\r\n'],
  ['chunk longer than its size', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n'],
  ['chunk extension with a control character', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=\x01\r\nab\r\n'],
  ['chunk extension too long', `HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;${'x'.repeat(5000)}\r\nab\r\n`],
  ['bad trailer line ending', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\rY\r\n\r\n'],
];

describe('invalid responses are errors at every split', () => {
  it.each(INVALID)('%s', (_name, text) => {
    for (const chunks of splits(text)) {
      const r = parse(chunks);
      expect(r.error, JSON.stringify(chunks.slice(0, 3))).toBeDefined();
      expect(r.ended).toBe(false);
    }
  });

  it('headers over the limit, whether sent at once or a byte at a time', () => {
    const big = `HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(2000)}\r\nContent-Length: 0\r\n\r\n`;
    expect(parse([big], { max: 1024 }).error).toMatch(/larger than 1024/);
    expect(parse(big.split(''), { max: 1024 }).error).toMatch(/larger than 1024/);
    const endless = Array.from({ length: 100 }, () => `X-Pad: ${'b'.repeat(1000)}\r\n`);
    expect(parse(['HTTP/1.1 200 OK\r\n', ...endless], { max: 64 * 1024 }).error).toMatch(/larger than/);
    expect(parse([big], { max: 4096 }).error).toBeUndefined();
  });

  it('trailers over the limit', () => {
    const r = parse(['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n', `X-T: ${'t'.repeat(3000)}\r\n\r\n`], { max: 1024 });
    expect(r.error).toMatch(/trailers too large/);
  });

  it('the end of the connection mid-response is an error; before any byte too, and says nothing arrived', () => {
    expect(parse(['HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel'], { eof: true }).error).toMatch(/mid-response/);
    expect(parse(['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n'], { eof: true }).error).toMatch(/mid-response/);
    expect(parse(['HTTP/1.1 200 OK\r\nContent-Le'], { eof: true }).error).toMatch(/mid-response/);
    const nothing = parse([], { eof: true });
    expect(nothing.error).toMatch(/before answering/);
    const p = new ResponseParser();
    p.start({ onHead: () => undefined, onBody: () => undefined, onEnd: () => undefined }, false);
    expect(p.received).toBe(false);
  });

  it('bytes with no request in flight are an error', () => {
    expect(new ResponseParser().execute(Buffer.from('HTTP/1.1 200 OK\r\n\r\n'))?.message).toMatch(/without a request/);
  });

  it('random bytes never throw (1000 inputs, after a valid head and from the start)', () => {
    for (let i = 0; i < 1000; i++) {
      const noise = randomBytes(1 + (i % 200));
      for (const prefix of ['', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n', 'HTTP/1.1 200 OK\r\n']) {
        expect(() => parse([prefix, noise, noise], { eof: true })).not.toThrow();
      }
    }
  });

  it('stop() from inside a callback delivers nothing more', () => {
    const p = new ResponseParser();
    const seen: string[] = [];
    p.start(
      {
        onHead: () => seen.push('head'),
        onBody: (c) => {
          seen.push(c.toString());
          p.stop();
        },
        onEnd: () => seen.push('end'),
      },
      false,
    );
    expect(p.execute(Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n'))).toBeNull();
    expect(seen).toEqual(['head', 'a']);
  });
});
