import { describe, expect, it } from 'vitest';
import { unifiedDiff } from '../../../src/reconcilers/nginx/apply.js';

const lines = (...l: string[]) => `${l.join('\n')}\n`;

describe('unifiedDiff', () => {
  it.each([
    ['equal texts', lines('a', 'b'), lines('a', 'b'), ''],
    ['a created file', null, lines('a', 'b'), lines('--- /dev/null', '+++ b/f.conf', '@@ -0,0 +1,2 @@', '+a', '+b')],
    ['a deleted file', lines('a'), null, lines('--- a/f.conf', '+++ /dev/null', '@@ -1,1 +0,0 @@', '-a')],
    [
      'a changed line',
      lines('a', 'b', 'c'),
      lines('a', 'x', 'c'),
      lines('--- a/f.conf', '+++ b/f.conf', '@@ -1,3 +1,3 @@', ' a', '-b', '+x', ' c'),
    ],
    ['an inserted line', lines('a', 'c'), lines('a', 'b', 'c'), lines('--- a/f.conf', '+++ b/f.conf', '@@ -1,2 +1,3 @@', ' a', '+b', ' c')],
  ])('%s', (_name, a, b, want) => expect(unifiedDiff(a, b, 'f.conf')).toBe(want));

  it('keeps 3 lines of context and splits distant changes into hunks', () => {
    const a = Array.from({ length: 20 }, (_, i) => `l${i + 1}`);
    const b = [...a];
    b[1] = 'X';
    b[17] = 'Y';
    const d = unifiedDiff(lines(...a), lines(...b), 'f.conf');
    expect(d).toBe(
      lines(
        '--- a/f.conf',
        '+++ b/f.conf',
        '@@ -1,5 +1,5 @@',
        ' l1',
        '-l2',
        '+X',
        ' l3',
        ' l4',
        ' l5',
        '@@ -15,6 +15,6 @@',
        ' l15',
        ' l16',
        ' l17',
        '-l18',
        '+Y',
        ' l19',
        ' l20',
      ),
    );
  });

  it('round-trips: applying the hunks to the old text gives the new text', () => {
    const a = lines('server {', '    listen 80;', '    a;', '    b;', '}', 'x', 'y');
    const b = lines('# new', 'server {', '    listen 80;', '    b;', '    c;', '}', 'y', 'z');
    const d = unifiedDiff(a, b, 'f.conf')
      .split('\n')
      .slice(2)
      .filter((l) => l && !l.startsWith('@@'));
    expect(
      d
        .filter((l) => !l.startsWith('-'))
        .map((l) => l.slice(1))
        .join('\n') + '\n',
    ).toBe(b);
    expect(
      d
        .filter((l) => !l.startsWith('+'))
        .map((l) => l.slice(1))
        .join('\n') + '\n',
    ).toBe(a);
  });
});
