import { describe, expect, it } from 'vitest';
import { OwnedConf } from '../../../src/reconcilers/nginx/owned-conf.js';

describe('OwnedConf.hash', () => {
  const conf = (): OwnedConf => new OwnedConf('/nonexistent', 60_000);

  it('is made from the names and texts alone: any order, any instance', () => {
    const a = new Map([
      ['sites/a.conf', 'server { a }'],
      ['sites/b.conf', 'server { b }'],
    ]);
    const b = new Map([
      ['sites/b.conf', 'server { b }'],
      ['sites/a.conf', 'server { a }'],
    ]);
    expect(conf().hash(a)).toBe(conf().hash(b));
    expect(conf().hash(a)).toMatch(/^[0-9a-f]{64}$/);
  });

  it('changes with a text, a name, a file added or removed; a shifted boundary is a change', () => {
    const c = conf();
    const base = new Map([
      ['sites/a.conf', 'server { a }'],
      ['sites/b.conf', 'server { b }'],
    ]);
    const h = c.hash(base);
    const seen = new Set([h]);
    for (const files of [
      new Map([...base, ['sites/b.conf', 'server { B }']]),
      new Map([...base, ['sites/c.conf', 'x']]),
      new Map([['sites/a.conf', 'server { a }']]),
      new Map([
        ['sites/a.conf', 'server { a }'],
        ['sites/bb.conf', 'server { b }'],
      ]),
    ]) {
      const next = c.hash(files);
      expect(seen.has(next)).toBe(false);
      seen.add(next);
    }
    expect(c.hash(new Map(base))).toBe(h); // back to the same texts: the same hash
    expect(conf().hash(new Map([['ab', 'c']]))).not.toBe(conf().hash(new Map([['a', 'bc']])));
  });
});
