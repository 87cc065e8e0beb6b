// The head of an HTTP/1.x request read straight off a client's socket, for the proxy's fast path:
// is it complete, is it valid, and what does it say. It faces the internet, so it is strict
// wherever leniency could let another parser disagree about where a request ends (request
// smuggling, RFC 9112 §11.2): CRLF only, no obs-fold, no space before a colon, one Content-Length
// value, Transfer-Encoding only alone and ending in chunked, exactly one Host in HTTP/1.1. Any
// doubt is an error carrying the status to answer with. One pass over one latin1 string; nothing
// past the head's CRLFCRLF (a body, a pipelined request) is read.

import { fieldValue, isOws, sameLower } from './field.js';

/** A complete, valid request head. */
export interface RequestHead {
  method: string; // as sent (a token)
  target: string; // request-target as sent, byte for byte (latin1 string)
  minor: 0 | 1; // HTTP/1.0 or HTTP/1.1
  rawHeaders: string[]; // [name, value, name, value, …] in order, names as sent, values with leading/trailing OWS (SP/HTAB) removed
  contentLength: number; // -1 when no Content-Length header
  transferEncoding: boolean; // a Transfer-Encoding header is present (any value)
  host: string | undefined; // the Host header value
  keepAlive: boolean; // HTTP/1.1: true unless a Connection header has the token "close"; HTTP/1.0: false unless a Connection token "keep-alive" (tokens case-insensitive, comma-separated, OWS around)
  expect: boolean; // an Expect header is present
  upgrade: boolean; // an Upgrade header is present, or a Connection token "upgrade"
  size: number; // bytes of the head including the final CRLFCRLF
}

export type HeadResult =
  | { kind: 'head'; head: RequestHead }
  | { kind: 'incomplete' } // no CRLFCRLF yet and still under maxSize
  | { kind: 'error'; status: 400 | 431 | 501 | 505; reason: string };

const CRLFCRLF = Buffer.from('\r\n\r\n', 'latin1');
const CR = 13;
const LF = 10;
const MAX_HEADER_LINES = 256;

/** method SP request-target SP HTTP/d.d CRLF: a token (RFC 9110 §5.6.2), a target without CTLs or spaces. */
const REQUEST_LINE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e\x80-\xff]+ HTTP\/\d\.\d\r\n/;
/** name ":" value CRLF, repeated: token names, values without CTLs but HTAB. */
const HEADER_BLOCK = /^(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*$/;
const DIGITS = /^\d{1,15}$/;

// Connection tokens we act on, as bits (numbers, not an enum).
const CLOSE = 1;
const KEEP_ALIVE = 2;
const UPGRADE = 4;

const INCOMPLETE: HeadResult = Object.freeze({ kind: 'incomplete' });

/**
 * The request head at `buf[from…]`. `maxSize` bounds the head including its CRLFCRLF; a longer
 * one (or more than 256 header lines) is a 431.
 */
export function parseRequestHead(buf: Buffer, from: number, maxSize: number): HeadResult {
  const end = buf.indexOf(CRLFCRLF, from);
  if (end === -1) {
    if (buf.length - from > maxSize) return fail(431, 'request head too large');
    // A head that can never end in a valid CRLFCRLF is refused now, not after maxSize bytes or a timeout.
    return hasBareLineEnd(buf, from) ? fail(400, 'bare CR or LF in the request head') : INCOMPLETE;
  }
  const size = end + 4 - from;
  if (size > maxSize) return fail(431, 'request head too large');
  const text = buf.toString('latin1', from, end + 2); // every line, each with its CRLF

  // 1. The request line: its shape, then the version, the method and the target's form.
  if (!REQUEST_LINE.test(text)) return fail(400, 'malformed request line');
  const eol = text.indexOf('\r\n');
  const sp = text.indexOf(' ');
  const major = text.charCodeAt(eol - 3) - 48;
  const m = text.charCodeAt(eol - 1) - 48;
  if (major !== 1 || (m !== 0 && m !== 1)) return fail(505, 'HTTP version not supported');
  const minor: 0 | 1 = m === 0 ? 0 : 1;
  const method = text.slice(0, sp);
  const target = text.slice(sp + 1, eol - 9); // eol - 9: the space before "HTTP/1.x"
  if (method === 'CONNECT') return fail(501, 'CONNECT not supported');
  if (target.charCodeAt(0) !== 0x2f && !(target === '*' && method === 'OPTIONS')) return fail(400, 'request target not in origin form');

  // 2. Header lines: the whole block checked by one regex, then split without further checks.
  if (eol + 2 < text.length && !HEADER_BLOCK.test(text.slice(eol + 2))) return fail(400, 'malformed header line');
  const rawHeaders: string[] = [];
  let contentLength = -1;
  let te = false;
  let chunked = false;
  let host: string | undefined;
  let connection = 0;
  let expect = false;
  let upgrade = false;
  let lines = 0;
  for (let p = eol + 2; p < text.length;) {
    if (++lines > MAX_HEADER_LINES) return fail(431, 'too many header lines');
    const e = text.indexOf('\r\n', p);
    const colon = text.indexOf(':', p);
    const name = text.slice(p, colon);
    const value = fieldValue(text, colon, e);
    rawHeaders.push(name, value);
    p = e + 2;
    // Only the headers that decide framing and routing are looked at, by length first.
    switch (name.length) {
      case 4:
        if (sameLower(name, 0, 'host')) {
          if (host !== undefined) return fail(400, 'more than one Host header');
          host = value;
        }
        break;
      case 6:
        if (sameLower(name, 0, 'expect')) expect = true;
        break;
      case 7:
        if (sameLower(name, 0, 'upgrade')) upgrade = true;
        break;
      case 10:
        if (sameLower(name, 0, 'connection')) connection |= connectionTokens(value);
        break;
      case 14:
        if (sameLower(name, 0, 'content-length')) {
          if (!DIGITS.test(value)) return fail(400, 'invalid Content-Length');
          const n = Number(value);
          if (contentLength !== -1 && contentLength !== n) return fail(400, 'conflicting Content-Length headers');
          contentLength = n;
        }
        break;
      case 17:
        if (sameLower(name, 0, 'transfer-encoding')) {
          te = true;
          // Several headers make one list: the last header's last coding is the list's last.
          chunked = isToken(value, value.lastIndexOf(',') + 1, value.length, 'chunked');
        }
        break;
    }
  }

  // 3. Framing and Host, now that every header is known.
  if (te) {
    if (contentLength !== -1) return fail(400, 'both Transfer-Encoding and Content-Length');
    if (minor === 0) return fail(400, 'Transfer-Encoding in an HTTP/1.0 request');
    if (!chunked) return fail(400, 'Transfer-Encoding does not end in chunked');
  }
  if (minor === 1 && host === undefined) return fail(400, 'missing Host header');
  const keepAlive = (connection & CLOSE) === 0 && (minor === 1 || (connection & KEEP_ALIVE) !== 0);
  return {
    kind: 'head',
    head: {
      method,
      target,
      minor,
      rawHeaders,
      contentLength,
      transferEncoding: te,
      host,
      keepAlive,
      expect,
      upgrade: upgrade || (connection & UPGRADE) !== 0,
      size,
    },
  };
}

function fail(status: 400 | 431 | 501 | 505, reason: string): HeadResult {
  return { kind: 'error', status, reason };
}

/** Some LF in `buf[from…]` without a CR before it, or some CR followed by something else than LF. */
function hasBareLineEnd(buf: Buffer, from: number): boolean {
  for (let i = buf.indexOf(LF, from); i !== -1; i = buf.indexOf(LF, i + 1)) if (i === from || buf[i - 1] !== CR) return true;
  for (let i = buf.indexOf(CR, from); i !== -1 && i + 1 < buf.length; i = buf.indexOf(CR, i + 1)) if (buf[i + 1] !== LF) return true;
  return false;
}

/** CLOSE, KEEP_ALIVE and UPGRADE bits for the tokens of one Connection value. */
function connectionTokens(value: string): number {
  let bits = 0;
  for (let s = 0; s <= value.length;) {
    let e = value.indexOf(',', s);
    if (e === -1) e = value.length;
    if (isToken(value, s, e, 'close')) bits |= CLOSE;
    else if (isToken(value, s, e, 'keep-alive')) bits |= KEEP_ALIVE;
    else if (isToken(value, s, e, 'upgrade')) bits |= UPGRADE;
    s = e + 1;
  }
  return bits;
}

/** `s[start…end)`, OWS trimmed, equals `lower` ignoring ASCII case. */
function isToken(s: string, start: number, end: number, lower: string): boolean {
  while (start < end && isOws(s.charCodeAt(start))) start++;
  while (end > start && isOws(s.charCodeAt(end - 1))) end--;
  return end - start === lower.length && sameLower(s, start, lower);
}
