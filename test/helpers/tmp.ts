import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * A scratch directory removed by the returned cleanup. Enterable by other users (0711, not
 * listable), as /var/lib is: a gateway under it gives its Nginx workers (www-data) a path to
 * their dir; what is inside keeps its own modes (the state dir is 0700).
 */
export function tmpDir(prefix = 'dp-test-'): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
  chmodSync(dir, 0o711);
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}
