import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERRORS } from '../src/errors.js';

describe('error catalog', () => {
  const doc = readFileSync('docs/errors.md', 'utf8');
  it.each(Object.entries(ERRORS))('%s is documented with its HTTP status', (code, def) => {
    const row = doc.split('\n').find((l) => l.startsWith(`| \`${code}\` |`));
    expect(row, `docs/errors.md has no row for ${code}`).toBeDefined();
    expect(row).toContain(`| ${def.status} |`);
  });
});
