// The Nginx worker dir under the host unit's UMask=0077: the directories created on the way to
// it stay passable for the workers (0755), the worker dir and its parts have the modes given
// them explicitly, and directories that were there already keep theirs.

import { chmodSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { prepareWorkerDirs } from '../../src/gateway/nginx-worker.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir('dp-worker-dirs-');
let previous: number;

beforeAll(() => {
  previous = process.umask(0o077);
});
afterAll(() => {
  process.umask(previous);
  t.cleanup();
});

const mode = (p: string): number => statSync(p).mode & 0o777;

it('creates the missing parents 0755 and the parts with their own modes, whatever the umask', async () => {
  const existing = join(t.dir, 'kept');
  mkdirSync(existing);
  chmodSync(existing, 0o750);
  const dir = join(existing, 'a', 'b', 'worker');
  const out = await prepareWorkerDirs(dir, null);
  expect(mode(join(existing, 'a'))).toBe(0o755);
  expect(mode(join(existing, 'a', 'b'))).toBe(0o755);
  expect(mode(existing)).toBe(0o750);
  // Without a separate worker user the parts stay owner-only; the ACME challenge path is readable.
  for (const d of [out.dir, out.socketDir, out.acmeWebroot, out.tempDir]) expect(mode(d), d).toBe(0o700);
  expect(mode(join(out.acmeWebroot, '.well-known'))).toBe(0o755);
  expect(mode(join(out.acmeWebroot, '.well-known', 'acme-challenge'))).toBe(0o755);
});
