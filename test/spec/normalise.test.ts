// Property tests of normalise() and hashSpec() over seeded random documents: equal intent,
// equal hash, whatever the key order, list order, case, syntax or spelt-out defaults; any
// single change, a different hash.

import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { stringify, type ToStringOptions } from 'yaml';
import {
  DEFAULT_CLIENT_MAX_BODY_SIZE,
  LETS_ENCRYPT_PRODUCTION,
  hashSpec,
  wholeTextHash,
  normalise,
  specChunks,
  specJson,
  parseDocument,
  type ProxyState,
} from '../../src/spec/index.js';
import type { ProxyStateInput } from '../../src/spec/input.js';
import { generateDocument } from '../../bench/generate.js';
import { chance, leaves, prng, setAt, shuffleDeep } from './fixtures.js';
import { randomDocument, recased } from './generate.js';
import { expectValid } from './expect.js';

const SEEDS = Array.from({ length: 25 }, (_, i) => i + 1);

function stateOf(doc: unknown): ProxyState {
  return expectValid(doc);
}

const hashOf = (doc: unknown): string => hashSpec(stateOf(doc));

describe.each(SEEDS)('seed %i', (seed) => {
  const doc = randomDocument(prng(seed));
  const state = stateOf(doc);
  const hash = hashSpec(state);

  it('shuffled keys at every level and shuffled lists give an equal state and hash', () => {
    const rng = prng(seed * 7919);
    for (let k = 0; k < 5; k++) {
      const shuffledDoc = shuffleDeep(rng, doc);
      expect(stateOf(shuffledDoc)).toEqual(state);
      expect(hashOf(shuffledDoc)).toBe(hash);
    }
  });

  it('YAML in several styles and JSON of the same document give an equal hash', () => {
    const rng = prng(seed * 104729);
    const styles: ToStringOptions[] = [
      {},
      { collectionStyle: 'flow' },
      { collectionStyle: 'block', indent: 4, indentSeq: false },
      { defaultStringType: 'QUOTE_DOUBLE', defaultKeyType: 'PLAIN' },
      { defaultStringType: 'QUOTE_SINGLE', defaultKeyType: 'QUOTE_SINGLE' },
      { defaultStringType: 'BLOCK_LITERAL' },
      { lineWidth: 20, minContentWidth: 0, doubleQuotedAsJSON: true },
    ];
    for (const style of styles) {
      const text = stringify(shuffleDeep(rng, doc), style);
      expect(hashOf(parseDocument(text, 'yaml')), `${JSON.stringify(style)}:\n${text}`).toBe(hash);
    }
    expect(hashOf(parseDocument(JSON.stringify(doc), 'json'))).toBe(hash);
    expect(hashOf(parseDocument(JSON.stringify(shuffleDeep(rng, doc), null, 2), 'json'))).toBe(hash);
    expect(hashOf(parseDocument(JSON.stringify(doc), 'yaml'))).toBe(hash); // JSON is YAML
  });

  it('names, domains, header names and hosts in any case give an equal hash', () => {
    const rng = prng(seed * 31);
    expect(hashOf(recased(rng, doc))).toBe(hash);
  });

  it('is idempotent: normalising a normalised state changes nothing', () => {
    const again = normalise(state);
    expect(again).toEqual(state);
    expect(JSON.stringify(again)).toBe(JSON.stringify(state));
    expect(hashSpec(again)).toBe(hash);
    expect(stateOf(state)).toEqual(state); // a normalised state is a valid document
  });

  it('defaults omitted and defaults written out give an equal hash', () => {
    const rng = prng(seed * 613);
    const bare = withoutDefaults(state, () => true);
    expect(hashOf(bare)).toBe(hash);
    for (let k = 0; k < 3; k++) expect(hashOf(withoutDefaults(state, () => chance(rng)))).toBe(hash);
    expect(hashOf(withoutDefaults(doc, () => false))).toBe(hash);
  });

  it('any single field change gives a different hash', () => {
    const paths = leaves(state.spec, '/spec').filter(([p]) => !/\/(format|type)$/.test(p));
    let changed = 0;
    for (const [path, value] of paths) {
      expect(hashWithChange(state, path, value), path).not.toBe(hash);
      changed++;
    }
    expect(hashSpec(normalise(state))).toBe(hash); // every change was undone
    expect(changed).toBe(paths.length);
    expect(changed).toBeGreaterThan(0);
  });
});

describe('on a generated document of 1,000 services', () => {
  it('shuffling keys and lists leaves the hash unchanged', () => {
    const doc = generateDocument(1000, 3);
    const rng = prng(42);
    expect(hashOf(shuffleDeep(rng, doc))).toBe(hashOf(doc));
  });

  it('the field changes of many leaves each change the hash', () => {
    const state = stateOf(generateDocument(1000, 3));
    const hash = hashSpec(state);
    const rng = prng(7);
    const paths = leaves(state.spec, '/spec').filter(([p]) => !/\/(format|type)$/.test(p));
    for (let k = 0; k < 100; k++) {
      const [path, value] = paths[Math.floor(rng() * paths.length)]!;
      expect(hashWithChange(state, path, value), path).not.toBe(hash);
    }
  });
});

describe('hashSpec', () => {
  it('is the sha256 hex digest of the spec', () => {
    expect(hashOf(generateDocument(3, 1))).toMatch(/^[0-9a-f]{64}$/);
  });

  it('is made from the content alone: a copy sharing no object hashes the same; specJson is JSON.stringify', () => {
    for (const seed of SEEDS) {
      const state = stateOf(randomDocument(prng(seed)));
      expect(specJson(state.spec)).toBe(JSON.stringify(state.spec));
      expect(hashSpec(structuredClone(state))).toBe(hashSpec(state));
    }
    const big = stateOf(generateDocument(50, 2));
    // The next generation shares every service object but one: the shared digests are reused.
    const [first, ...rest] = big.spec.services;
    const next: ProxyState = { ...big, spec: { ...big.spec, services: [{ ...first!, clientMaxBodySize: 1 }, ...rest] } };
    expect(hashSpec(next)).toBe(hashSpec(structuredClone(next)));
    expect(hashSpec(next)).not.toBe(hashSpec(big));
    // Order and membership count, not only the set of service digests.
    const swapped: ProxyState = { ...big, spec: { ...big.spec, services: [rest[0]!, first!, ...rest.slice(1)] } };
    expect(hashSpec(swapped)).not.toBe(hashSpec(big));
    const none: ProxyState = { ...big, spec: { ...big.spec, services: [] } };
    expect(specJson(none.spec)).toBe(JSON.stringify(none.spec));
    expect(hashSpec(none)).not.toBe(hashSpec(big));
  });

  it("specChunks are the bytes of specJson with the same separator, and reuse an unchanged service's bytes", () => {
    for (const seed of SEEDS) {
      const state = stateOf(randomDocument(prng(seed)));
      expect(Buffer.concat(specChunks(state.spec, ',\n')).toString('utf8')).toBe(specJson(state.spec, ',\n'));
      expect(Buffer.concat(specChunks(state.spec)).toString('utf8')).toBe(JSON.stringify(state.spec));
    }
    const big = stateOf(generateDocument(20, 1));
    const [first, ...rest] = big.spec.services;
    const next: ProxyState = { ...big, spec: { ...big.spec, services: [{ ...first!, clientMaxBodySize: 1 }, ...rest] } };
    const a = specChunks(big.spec);
    const b = specChunks(next.spec);
    const shared = b.filter((chunk) => a.includes(chunk));
    expect(shared.length).toBeGreaterThanOrEqual(rest.length);
    expect(Buffer.concat(b).toString('utf8')).toBe(JSON.stringify(next.spec));
  });

  it('wholeTextHash is the form stored files carried before: sha256 of JSON.stringify(spec)', () => {
    const plain = (state: ProxyState): string => createHash('sha256').update(JSON.stringify(state.spec)).digest('hex');
    const big = stateOf(generateDocument(50, 2));
    expect(wholeTextHash(big)).toBe(plain(big));
    expect(hashSpec(big)).not.toBe(plain(big));
  });

  it('ignores metadata (generation and hash are not intent)', () => {
    const doc = generateDocument(3, 1);
    expect(hashOf({ ...doc, metadata: { generation: 7, hash: 'a'.repeat(64) } })).toBe(hashOf(doc));
  });
});

/** The hash with one leaf changed in place (then restored: cloning 1,000 services is slow). */
function hashWithChange(state: ProxyState, path: string, value: unknown): string {
  setAt(state, path, changedValue(value));
  try {
    return hashSpec(normalise(state));
  } finally {
    setAt(state, path, value);
  }
}

/** A different value of the same type, one that normalise() cannot fold back. */
function changedValue(v: unknown): unknown {
  if (typeof v === 'boolean') return !v;
  if (typeof v === 'number') return Number.isInteger(v) ? v + 1 : v + 0.5;
  if (typeof v === 'string') return `${v}x`;
  throw new Error(`unexpected leaf ${JSON.stringify(v)}`);
}

/** Default values by JSON pointer (array indices as *), as the document reference lists them. */
const DEFAULTS: Array<[RegExp, unknown]> = [
  [/^\/spec\/acme$/, { server: LETS_ENCRYPT_PRODUCTION }],
  [/^\/spec\/acme\/server$/, LETS_ENCRYPT_PRODUCTION],
  [/^\/spec\/(projects|services|entrypoints)$/, []],
  [/^\/spec\/services\/\d+\/(https|auth|stripPrefix)$/, true],
  [/^\/spec\/services\/\d+\/clientMaxBodySize$/, DEFAULT_CLIENT_MAX_BODY_SIZE],
  [/^\/spec\/services\/\d+\/(rateLimits|replicas)$/, []],
  [/^\/spec\/services\/\d+\/rateLimits\/\d+\/burst$/, 0],
  [/^\/spec\/services\/\d+\/model\/prefix$/, '/v1'],
  [/^\/spec\/services\/\d+\/replicas\/\d+\/(ssh|sshProxy|sshHeadProxy)\/port$/, 22],
  [/^\/spec\/entrypoints\/\d+\/https$/, true],
];

/** A copy without the fields that hold their default value, where `drop()` says so. */
function withoutDefaults(doc: ProxyStateInput | ProxyState, drop: () => boolean): unknown {
  const walk = (v: unknown, at: string): unknown => {
    if (Array.isArray(v)) return v.map((x, i) => walk(x, `${at}/${i}`));
    if (v === null || typeof v !== 'object') return v;
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      const path = `${at}/${k}`;
      const rule = DEFAULTS.find(([re]) => re.test(path));
      if (rule && JSON.stringify(rule[1]) === JSON.stringify(x) && drop()) continue;
      out[k] = walk(x, path);
    }
    return out;
  };
  return walk(doc, '');
}
