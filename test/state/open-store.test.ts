import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { openStore, parseStoreUrl, redactStoreUrl } from '../../src/state/open-store.js';
import { tmpDir } from '../helpers/tmp.js';

describe('parseStoreUrl', () => {
  it.each([
    ['sqlite:./proxy.db', { kind: 'sqlite', path: './proxy.db' }],
    ['sqlite:/var/lib/dstack-proxy/proxy.db', { kind: 'sqlite', path: '/var/lib/dstack-proxy/proxy.db' }],
    ['sqlite:///var/lib/proxy.db', { kind: 'sqlite', path: '/var/lib/proxy.db' }],
    ['postgres://u:p@db:5432/proxy', { kind: 'postgres', connectionString: 'postgres://u:p@db:5432/proxy' }],
    ['postgresql://db/proxy?sslmode=require', { kind: 'postgres', connectionString: 'postgresql://db/proxy?sslmode=require' }],
    ['/var/lib/dstack-proxy', { kind: 'file', stateDir: '/var/lib/dstack-proxy' }],
    ['file:./state', { kind: 'file', stateDir: './state' }],
  ])('%s', (url, expected) => {
    expect(parseStoreUrl(url)).toEqual(expected);
  });

  it.each(['', 'sqlite:', 'mysql://db/x', 'file:'])('refuses %j', (url) => {
    expect(() => parseStoreUrl(url)).toThrow(expect.objectContaining({ code: 'DP_ERR_BAD_OPTION' }));
  });

  it('hides the password in messages', () => {
    expect(redactStoreUrl('postgres://u:secret@db/x')).toBe('postgres://u:***@db/x');
    expect(() => parseStoreUrl('mysql://u:secret@db/x')).toThrow(/u:\*\*\*@db/);
  });
});

describe('openStore', () => {
  it('opens a SQLite file and a state directory', async () => {
    const t = tmpDir();
    try {
      const sqlite = await openStore(`sqlite:${path.join(t.dir, 'p.db')}`);
      const file = await openStore(path.join(t.dir, 'state'));
      expect([sqlite.kind, file.kind]).toEqual(['sqlite', 'file']);
      await Promise.all([sqlite.close(), file.close()]);
    } finally {
      t.cleanup();
    }
  });
});
