// sha256 of the canonical serialisation of the normalised spec: equal intent, equal hash,
// whatever the key order or style of the input.

import { createHash } from 'node:crypto';
import { serviceKey, type ProxyState, type ProxyStateSpec, type Service } from './types.js';

/**
 * Hash of a normalised state. normalise() builds every object in one fixed key order, so
 * JSON.stringify of its output is already canonical (and ten times faster than sorting keys
 * on the way); hashSpec re-normalises nothing, so pass it normalise()'s output, never raw input.
 *
 * The bytes hashed are exactly JSON.stringify(state.spec) — the value stored in state.json and
 * database rows and compared on load — but built from one memoised JSON text per service object
 * (specJson), so hashing a document in which one service changed serialises only that service.
 */
export function hashSpec(state: ProxyState): string {
  const h = createHash('sha256');
  // The same bytes as specJson, fed a part at a time: joining them first costs more than the
  // hashing itself.
  writeSpec(state.spec, ',', (text) => h.update(text));
  return h.digest('hex');
}

/**
 * JSON of each service object already serialised. Sound because a normalised service is never
 * changed in place: normalise() and the dstack mapper build a new object for every change and
 * share the untouched ones between generations, which is what makes the memo pay.
 */
const serviceTexts = new WeakMap<Service, string>();

/** JSON.stringify(service), memoised per service object. */
export function serviceJson(service: Service): string {
  let text = serviceTexts.get(service);
  if (text === undefined) {
    text = JSON.stringify(service);
    serviceTexts.set(service, text);
  }
  return text;
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

/** Writes the text of specJson in parts, in order. */
function writeSpec(spec: ProxyStateSpec, between: string, write: (text: string) => void): void {
  write('{');
  let first = true;
  for (const key of Object.keys(spec)) {
    const value = (spec as unknown as Record<string, unknown>)[key];
    if (key === 'services' && Array.isArray(value)) {
      write(`${first ? '' : ','}${JSON.stringify(key)}:[`);
      const services = value as Service[];
      for (let i = 0; i < services.length; i++) {
        const s = services[i];
        if (i) write(between);
        // JSON.stringify writes null for a hole or undefined; a service is always an object.
        write(s !== null && typeof s === 'object' ? serviceJson(s) : (JSON.stringify(s) ?? 'null'));
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
