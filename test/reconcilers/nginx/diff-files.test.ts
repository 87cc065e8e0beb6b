// diffFiles, the Nginx loop's plan: rendered files against what readOwned found, no I/O.

import { describe, expect, it } from 'vitest';
import { diffFiles, type OwnedFiles } from '../../../src/reconcilers/nginx/apply.js';

const owned = (files: Record<string, string>, foreign: string[] = []): OwnedFiles => ({
  owned: new Map(Object.entries(files)),
  foreign: new Set(foreign),
});

describe('diffFiles', () => {
  it('lists creates, updates and conflicts in render order, then deletes; equal files not at all', () => {
    const rendered = new Map([
      ['global.conf', 'g'],
      ['sites/b.conf', 'b2'],
      ['sites/a.conf', 'a'],
      ['sites/same.conf', 'same'],
      ['sites/hand.conf', 'ours'],
    ]);
    const changes = diffFiles(
      rendered,
      owned({ 'global.conf': 'g', 'sites/b.conf': 'b1', 'sites/same.conf': 'same', 'sites/old.conf': 'old' }, ['sites/hand.conf']),
    );
    expect(changes).toEqual([
      { kind: 'update', name: 'sites/b.conf', text: 'b2', previous: 'b1' },
      { kind: 'create', name: 'sites/a.conf', text: 'a', previous: null },
      { kind: 'conflict', name: 'sites/hand.conf', text: 'ours', previous: null },
      { kind: 'delete', name: 'sites/old.conf', text: null, previous: 'old' },
    ]);
  });

  it('nothing to do when the dir holds the render', () => {
    expect(diffFiles(new Map([['a.conf', 'x']]), owned({ 'a.conf': 'x' }))).toEqual([]);
    expect(diffFiles(new Map(), owned({}))).toEqual([]);
  });

  it('never a foreign file to delete', () => {
    expect(diffFiles(new Map(), owned({}, ['sites/hand.conf']))).toEqual([]);
  });

  it('refuses a name outside the conf dir', () => {
    expect(() => diffFiles(new Map([['../x.conf', '']]), owned({}))).toThrow(expect.objectContaining({ code: 'DP_ERR_INTERNAL' }));
    expect(() => diffFiles(new Map([['/etc/x.conf', '']]), owned({}))).toThrow(expect.objectContaining({ code: 'DP_ERR_INTERNAL' }));
  });
});
