// The document hash: sha256 over the canonical serialisation of the normalised spec, with each
// service contributing the sha256 of its own text (kept per service object), so equal intent
// gives an equal hash whatever the key order or style of the input, and a change to one service
// hashes that service and 32 bytes for each of the others.

import * as crypto from 'node:crypto';
import { createHash } from 'node:crypto';
import { serviceKey, type ProxyState, type ProxyStateSpec, type Service } from './types.js';

/** Marks the per-service form, so no document hashes to what a whole-text hash once gave. */
const HASH_FORM = 'dstack-proxy/spec-hash/2\n';

/**
 * Hash of a normalised state. normalise() builds every object in one fixed key order, so
 * JSON.stringify of its output is already canonical (and ten times faster than sorting keys
 * on the way); hashSpec re-normalises nothing, so pass it normalise()'s output, never raw input.
 *
 * What is hashed is the text of JSON.stringify(state.spec) with each service's text replaced by
 * its own sha256 (memoised per service object, like the text): a tree of hashes, so a document
 * in which one service changed costs that service and 32 bytes per other service, not the whole
 * document's text.
 */
export function hashSpec(state: ProxyState): string {
  const h = createHash('sha256');
  h.update(HASH_FORM);
  // The services' digests are gathered and fed at once: a call into the hash per 32 bytes cost
  // more than the hashing.
  let digests = Buffer.allocUnsafe(32 * state.spec.services.length);
  let filled = 0;
  const flush = (): void => {
    if (filled === 0) return;
    h.update(digests.subarray(0, filled));
    digests = digests.subarray(filled);
    filled = 0;
  };
  writeSpec(
    state.spec,
    null,
    (text) => {
      flush();
      h.update(text);
    },
    (service) => {
      filled += serviceDigest(service).copy(digests, filled);
    },
  );
  flush();
  return h.digest('hex');
}

/**
 * The hash stored files carried before services were hashed on their own: sha256 of
 * JSON.stringify(spec). Read only to accept such a file on load; the next write stores the
 * current form.
 */
export function wholeTextHash(state: ProxyState): string {
  const h = createHash('sha256');
  writeSpec(state.spec, ',', (text) => h.update(text));
  return h.digest('hex');
}

/**
 * sha256 of one service's text. Node's one-shot hash (20.12 and later) costs half what a Hash
 * object does at this size, which is most of a cold hash of 10,000 services.
 */
const oneShot = (crypto as Partial<typeof crypto>).hash;
const sha256: (text: string) => Buffer =
  typeof oneShot === 'function' ? (text) => oneShot('sha256', text, 'buffer') : (text) => createHash('sha256').update(text).digest();

/**
 * What is derived from a service object's JSON, made once per object: its text, and when first
 * asked its sha256 (the document hash) and UTF-8 bytes (a stored file). Sound because a
 * normalised service is never changed in place: normalise() and the dstack mapper build a new
 * object for every change and share the untouched ones between generations, which is what makes
 * the memo pay.
 */
interface ServiceMemo {
  text: string;
  digest?: Buffer;
  bytes?: Buffer;
}

const serviceMemos = new WeakMap<Service, ServiceMemo>();

function memoOf(service: Service): ServiceMemo {
  let memo = serviceMemos.get(service);
  if (memo === undefined) {
    memo = { text: JSON.stringify(service) };
    serviceMemos.set(service, memo);
  }
  return memo;
}

/** JSON.stringify(service), memoised per service object. */
export function serviceJson(service: Service): string {
  return memoOf(service).text;
}

function serviceDigest(service: Service): Buffer {
  const memo = memoOf(service);
  return (memo.digest ??= sha256(memo.text));
}

/**
 * JSON.stringify(spec), byte for byte, with the services' texts memoised. `between` goes between
 * two services instead of a bare comma (a newline keeps a stored file readable a service a line);
 * the text then parses to the same value but is no longer the bytes hashed.
 */
export function specJson(spec: ProxyStateSpec, between = ','): string {
  const parts: string[] = [];
  writeSpec(spec, between, (text) => parts.push(text));
  return parts.join('');
}

/**
 * specJson's text as UTF-8 byte chunks, each service's bytes memoised per service object: what
 * a file write hands the kernel, with neither a join of the whole text nor an encoding of the
 * services that did not change.
 */
export function specChunks(spec: ProxyStateSpec, between = ','): Buffer[] {
  const chunks: Buffer[] = [];
  const separator = Buffer.from(between, 'utf8');
  writeSpec(
    spec,
    between,
    (text) => chunks.push(text === between ? separator : Buffer.from(text, 'utf8')),
    (service) => {
      const memo = memoOf(service);
      chunks.push((memo.bytes ??= Buffer.from(memo.text, 'utf8')));
    },
  );
  return chunks;
}

/**
 * Writes the text of specJson in parts, in order. With `service`, each service object goes to it
 * instead of its text being written; `between` null leaves the separators out (digests are of
 * one length and need none).
 */
function writeSpec(spec: ProxyStateSpec, between: string | null, write: (text: string) => void, service?: (s: Service) => void): void {
  write('{');
  let first = true;
  for (const key of Object.keys(spec)) {
    const value = (spec as unknown as Record<string, unknown>)[key];
    if (key === 'services' && Array.isArray(value)) {
      write(`${first ? '' : ','}${JSON.stringify(key)}:[`);
      const services = value as Service[];
      for (let i = 0; i < services.length; i++) {
        const s = services[i];
        if (i && between !== null) write(between);
        // JSON.stringify writes null for a hole or undefined; a service is always an object.
        if (s !== null && typeof s === 'object') {
          if (service) service(s);
          else write(serviceJson(s));
        } else write(JSON.stringify(s) ?? 'null');
      }
      write(']');
    } else {
      const text = JSON.stringify(value);
      if (text === undefined) continue; // undefined (or a function) is left out, as JSON.stringify does
      write(`${first ? '' : ','}${JSON.stringify(key)}:${text}`);
    }
    first = false;
  }
  write('}');
}

/** JSON with object keys sorted; undefined members dropped, as JSON.stringify does. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++) out += (i ? ',' : '') + canonicalJson(value[i]);
    return `${out}]`;
  }
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).sort();
  let out = '{';
  let first = true;
  for (const k of keys) {
    const v = obj[k];
    if (v === undefined) continue;
    out += `${first ? '' : ','}${JSON.stringify(k)}:${canonicalJson(v)}`;
    first = false;
  }
  return `${out}}`;
}

/**
 * `next` with every service equal, byte for byte once normalised, to the one of the same key in
 * `current` replaced by current's object. A whole-document PUT parses a new object for every
 * service; sharing the untouched ones makes everything memoised per service object hit (its
 * JSON here, the loops' desired objects, the rendered sites) and lets the parsed copies die
 * young instead of living on as the served document. The hashed bytes do not change.
 */
export function shareUnchanged(next: ProxyState, current: ProxyState): ProxyState {
  const before = new Map<string, Service>();
  for (const s of current.spec.services) before.set(serviceKey(s), s);
  let shared = 0;
  const services = next.spec.services.map((s) => {
    const old = before.get(serviceKey(s));
    if (old === undefined || old === s || serviceJson(old) !== serviceJson(s)) return s;
    shared++;
    return old;
  });
  // The spread keeps the key order, so specJson gives the same text.
  return shared === 0 ? next : { ...next, spec: { ...next.spec, services } };
}
