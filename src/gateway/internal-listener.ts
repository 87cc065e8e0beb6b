// The internal listener: how the gateway's own model API reaches its Nginx. A Unix socket in a
// directory only the gateway's user can enter (0700), so no other local process — nor an
// outside client relayed by a TLS terminator or an SSH forward on this host — can use the
// shortcut it gives (no auth_request, client address from X-Real-IP). Beside it, the key the
// entrypoint sites send to the model API to vouch for their X-Real-IP, in a file only Nginx's
// master reads (site files, plans and diffs show the include line, never the key).

import { randomBytes } from 'node:crypto';
import { chmod, mkdir, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { internalListen } from '../reconcilers/nginx/view.js';

export interface InternalListener {
  dir: string;
  /** The socket Nginx listens on (`listen unix:<socketPath>` in every service site). */
  socketPath: string;
  /** The file of `proxy_set_header` lines the entrypoint sites include. */
  keyInclude: string;
  /** The key those lines send. */
  key: string;
}

const KEY_LINE = /^proxy_set_header X-Dstack-Entrypoint-Key ([0-9a-f]{64});\n$/;

/** Create the 0700 directory and the key file (kept across restarts: a system Nginx may not reload). */
export async function prepareInternalListener(stateDir: string): Promise<InternalListener> {
  const dir = join(stateDir, 'nginx-internal');
  // A path too long for a Unix socket: said at start, not at every pass of the Nginx loop.
  internalListen(join(dir, 'nginx.sock'));
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const keyInclude = join(dir, 'entrypoint-key.conf');
  const existing = KEY_LINE.exec(await readFile(keyInclude, 'utf8').catch(() => ''));
  let key = existing?.[1];
  if (key === undefined) {
    key = randomBytes(32).toString('hex');
    const tmp = `${keyInclude}.${process.pid}.tmp`;
    await writeFile(tmp, `proxy_set_header X-Dstack-Entrypoint-Key ${key};\n`, { mode: 0o600 });
    await rename(tmp, keyInclude);
  }
  return { dir, socketPath: join(dir, 'nginx.sock'), keyInclude, key };
}

/**
 * Remove the socket file when nothing listens on it: Nginx does not unlink before bind, so a file
 * left by a master that was killed makes every later start or reload fail with "Address already
 * in use".
 */
export async function removeStaleSocket(path: string): Promise<void> {
  const live = await new Promise<boolean>((resolve) => {
    const s = connect({ path });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
  if (!live) await unlink(path).catch(() => undefined);
}
