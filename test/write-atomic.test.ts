import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_TEMP_RE, writeAtomic } from '../src/write-atomic.js';
import { tmpDir } from './helpers/tmp.js';

describe('writeAtomic', () => {
  let t: ReturnType<typeof tmpDir>;
  afterEach(() => t.cleanup());

  it('replaces the file with the given mode, creating the directory when asked', async () => {
    t = tmpDir();
    const file = join(t.dir, 'a', 'b', 'f.json');
    await writeAtomic(file, 'one', { makeDir: true, dirMode: 0o700, fsyncFile: true, fsyncDir: true });
    expect(readFileSync(file, 'utf8')).toBe('one');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(statSync(join(t.dir, 'a', 'b')).mode & 0o777).toBe(0o700);
    await writeAtomic(file, 'two', { mode: 0o644 });
    expect(readFileSync(file, 'utf8')).toBe('two');
    expect(readdirSync(join(t.dir, 'a', 'b'))).toEqual(['f.json']);
  });

  it('writes byte chunks in order, more of them than one gathered write takes (IOV_MAX 1,024), empty ones included', async () => {
    t = tmpDir();
    const file = join(t.dir, 'f');
    const chunks = Array.from({ length: 3000 }, (_, i) => Buffer.from(i % 7 === 0 ? '' : `${i},`, 'utf8'));
    chunks.push(Buffer.from('é—end', 'utf8'));
    await writeAtomic(file, chunks, { fsyncFile: true });
    expect(readFileSync(file)).toEqual(Buffer.concat(chunks));
    // A shorter content after a longer one: nothing of the old bytes is left at the end.
    await writeAtomic(file, [Buffer.from('ab'), Buffer.from('c')]);
    expect(readFileSync(file, 'utf8')).toBe('abc');
  });

  it('a failure before the rename leaves the old file and no temp; the temp has the default name', async () => {
    t = tmpDir();
    const file = join(t.dir, 'f');
    writeFileSync(file, 'old');
    const temps: string[] = [];
    const write = writeAtomic(file, 'new', {
      beforeRename: (temp) => {
        temps.push(temp);
        throw new Error('power cut');
      },
    });
    await expect(write).rejects.toThrow('power cut');
    expect(temps).toHaveLength(1);
    expect(temps[0]!.startsWith(`${t.dir}/`)).toBe(true);
    expect(DEFAULT_TEMP_RE.test(temps[0]!.slice(t.dir.length + 1))).toBe(true);
    expect(readFileSync(file, 'utf8')).toBe('old');
    expect(readdirSync(t.dir)).toEqual(['f']);
  });

  it('uses the caller-given temp name and maps a failure with the target path', async () => {
    t = tmpDir();
    const file = join(t.dir, 'missing-dir', 'f');
    const seen: string[] = [];
    const write = writeAtomic(file, 'x', {
      tempName: (base) => `.${base}.tmp-fixed`,
      mapError: (path, err) => {
        seen.push(path);
        return new Error(`mapped: ${(err as NodeJS.ErrnoException).code}`);
      },
    });
    await expect(write).rejects.toThrow('mapped: ENOENT');
    expect(seen).toEqual([file]);
    mkdirSync(join(t.dir, 'missing-dir'));
    await writeAtomic(file, 'x', { tempName: (base) => `.${base}.tmp-fixed` });
    expect(readdirSync(join(t.dir, 'missing-dir'))).toEqual(['f']);
  });
});
