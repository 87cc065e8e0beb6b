// shareUnchanged: a document read anew keeps the stored objects of the services it leaves as
// they were, so what is memoised per service object still applies; the hash never changes.

import { describe, expect, it } from 'vitest';
import { hashSpec, shareUnchanged, specJson } from '../../src/spec/index.js';
import { expectValid } from './expect.js';
import { baseDocument, edited } from './fixtures.js';

describe('shareUnchanged', () => {
  it('reuses the stored object of every equal service, keeps the changed and the new ones, and hashes the same', () => {
    const current = expectValid(baseDocument());
    const [first, second] = current.spec.services;
    // Parsed again: equal content, new objects; one service changed.
    const again = expectValid(edited(baseDocument(), ['/spec/services/1/domain', 'other.gw.example.com']));
    expect(again.spec.services[0]).not.toBe(first);
    const next = shareUnchanged(again, current);
    expect(next.spec.services[0]).toBe(first);
    expect(next.spec.services[1]).not.toBe(second);
    expect(next.spec.services[1]?.domain).toBe('other.gw.example.com');
    expect(specJson(next.spec)).toBe(specJson(again.spec));
    expect(hashSpec(next)).toBe(hashSpec(again));
    // The key order of the spec is the parsed one.
    expect(Object.keys(next.spec)).toEqual(Object.keys(again.spec));
  });

  it('gives the parsed document back when nothing is shared, and never matches another service', () => {
    const current = expectValid(baseDocument());
    const renamed = expectValid(edited(baseDocument(), ['/spec/services/0/run', 'renamed'], ['/spec/services/1/run', 'renamed-2']));
    expect(shareUnchanged(renamed, current)).toBe(renamed);
    const empty = expectValid(edited(baseDocument(), ['/spec/services', []]));
    expect(shareUnchanged(empty, current)).toBe(empty);
    expect(shareUnchanged(current, empty)).toBe(current);
  });
});
