// The internal listener's directory and the entrypoint key file, and stale socket removal.

import { existsSync, mkdirSync, statSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, describe, expect, it } from 'vitest';
import { prepareInternalListener, removeStaleSocket } from '../../src/gateway/internal-listener.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir('dp-internal-');
afterAll(() => t.cleanup());

describe('prepareInternalListener', () => {
  it('makes a 0700 dir and a 0600 key file that survives a restart', async () => {
    const a = await prepareInternalListener(join(t.dir, 'state'));
    expect(statSync(a.dir).mode & 0o777).toBe(0o700);
    expect(statSync(a.keyInclude).mode & 0o777).toBe(0o600);
    expect(await readFile(a.keyInclude, 'utf8')).toBe(`proxy_set_header X-Dstack-Entrypoint-Key ${a.key};\n`);
    expect(a.key).toMatch(/^[0-9a-f]{64}$/);
    const b = await prepareInternalListener(join(t.dir, 'state'));
    expect(b.key).toBe(a.key);
    expect(b.socketPath).toBe(join(t.dir, 'state', 'nginx-internal', 'nginx.sock'));
  });

  it('refuses a state dir whose socket path would not fit a Unix socket, creating nothing', async () => {
    const long = join(t.dir, 'x'.repeat(90));
    await expect(prepareInternalListener(long)).rejects.toThrow(/longer than 107 bytes/);
    expect(existsSync(long)).toBe(false);
  });
});

describe('removeStaleSocket', () => {
  it('removes a socket file nothing listens on, and keeps a live one', async () => {
    const dir = join(t.dir, 'socks');
    mkdirSync(dir);
    const live = join(dir, 'live.sock');
    const srv = createServer();
    await new Promise<void>((r) => srv.listen(live, r));
    const dead = join(dir, 'dead.sock');
    // A listener killed outright leaves its file behind.
    await execa(
      process.execPath,
      ['-e', `require('node:net').createServer().listen(${JSON.stringify(dead)}, () => process.kill(process.pid, 'SIGKILL'))`],
      { reject: false },
    );
    expect(existsSync(dead)).toBe(true);
    await removeStaleSocket(dead);
    await removeStaleSocket(live);
    expect(existsSync(dead)).toBe(false);
    expect(existsSync(live)).toBe(true);
    await removeStaleSocket(join(dir, 'missing.sock')); // nothing there: no error
    await new Promise<void>((r) => srv.close(() => r()));
  });
});
