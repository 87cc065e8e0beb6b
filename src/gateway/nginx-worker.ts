// Nginx's worker processes face the internet, so they never run as root: the private Nginx's
// master (root, to bind 80/443) starts them as --nginx-user, and with the system Nginx that is
// the user its workers already run as. The workers open a few paths themselves — the balancer
// sockets, the ACME webroot, the temp files of large request bodies — so those live in one
// worker dir outside the state dir (which stays 0700 and holds the secrets), readable by the
// worker's group only: 0710 directories (enter, not list), 0660 sockets. Everything else (site
// files, certificates, logs) the master opens before it drops privileges.

import { chmod, chown, mkdir, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { ProxyError } from '../errors.js';

/** The data-plane sockets' dir under the worker dir. */
export const SOCKETS_SUBDIR = 'sockets';

export interface WorkerIdentity {
  user: string;
  uid: number;
  gid: number;
  /** Every group the user is in (for the search-permission check of the dir's parents). */
  groups: number[];
}

export interface WorkerDirs {
  dir: string;
  socketDir: string;
  acmeWebroot: string;
  /** Nginx's temp dirs (client_body_temp …) go under it. */
  tempDir: string;
  /** The worker's group owns the dirs (and the balancer sockets), or null when the workers are the gateway's own user. */
  gid: number | null;
}

export type IdLookup = (args: string[]) => Promise<string>;

const defaultLookup: IdLookup = async (args) => (await execa('id', args)).stdout.trim();

/** uid, gid and groups of `user` (through NSS, as Nginx resolves it). */
export async function lookupUser(user: string, lookup: IdLookup = defaultLookup): Promise<WorkerIdentity> {
  if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]*$/.test(user))
    throw new ProxyError('DP_ERR_BAD_OPTION', `--nginx-user: not a user name: ${JSON.stringify(user)}`);
  let out: [string, string, string];
  try {
    out = [await lookup(['-u', user]), await lookup(['-g', user]), await lookup(['-G', user])];
  } catch {
    throw new ProxyError('DP_ERR_BAD_OPTION', `--nginx-user: no such user ${user} on this host`);
  }
  const [uid, gid] = [Number(out[0]), Number(out[1])];
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) throw new ProxyError('DP_ERR_BAD_OPTION', `--nginx-user: cannot resolve ${user}`);
  if (uid === 0)
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `--nginx-user ${user} is root: Nginx workers face the internet and must run as an unprivileged user`,
    );
  return { user, uid, gid, groups: out[2].split(/\s+/).filter(Boolean).map(Number) };
}

/** Whether `who` may search (enter) a directory with this owner and mode. */
function canSearch(who: WorkerIdentity, st: { uid: number; gid: number; mode: number }): boolean {
  if (st.uid === who.uid) return (st.mode & 0o100) !== 0;
  if (who.groups.includes(st.gid) || st.gid === who.gid) return (st.mode & 0o010) !== 0;
  return (st.mode & 0o001) !== 0;
}

/**
 * Every parent of `dir` must let the workers through, or they get EACCES at request time (502s,
 * 404 ACME challenges); say which one at start instead.
 */
export async function checkReachable(dir: string, who: WorkerIdentity): Promise<void> {
  for (let p = dirname(resolve(dir)); ; p = dirname(p)) {
    // A parent that does not exist yet is created 0755 (mkdir -p).
    const st = await stat(p).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    if (st && !canSearch(who, st)) {
      const mode = (st.mode & 0o7777).toString(8).padStart(4, '0');
      throw new ProxyError(
        'DP_ERR_BAD_OPTION',
        `Nginx workers run as ${who.user} and cannot reach ${dir}: ${p} (mode ${mode}, owner uid ${st.uid}) does not let them in; ` +
          `make it searchable (chmod o+x ${p}) or set --nginx-worker-dir to a directory under parents they can enter`,
      );
    }
    if (p === '/') return;
  }
}

/**
 * mkdir -p with every directory it creates 0755 whatever the umask (the unit's is 0077): the
 * workers must be able to pass through them to reach the worker dir. Existing ones are left.
 */
async function searchableParents(path: string): Promise<void> {
  const first = await mkdir(path, { recursive: true, mode: 0o755 });
  if (first === undefined) return;
  for (let p = path; p.length >= first.length; p = dirname(p)) {
    await chmod(p, 0o755);
    if (p === first) break;
  }
}

async function ownedDir(path: string, gid: number | null): Promise<void> {
  await mkdir(path, { recursive: true, mode: 0o700 });
  if (gid !== null) await chown(path, process.getuid?.() ?? -1, gid);
  await chmod(path, gid !== null ? 0o710 : 0o700);
}

/**
 * Create the worker dir and its parts. `who` null: the workers run as the gateway's own user
 * (a private Nginx started without root), and the dirs stay owner-only.
 */
export async function prepareWorkerDirs(dir: string, who: WorkerIdentity | null, logger?: Logger): Promise<WorkerDirs> {
  dir = resolve(dir);
  let gid = who && who.uid !== process.getuid?.() ? who.gid : null;
  // Checked before anything is created: a refused start leaves nothing behind.
  if (who && gid !== null) await checkReachable(dir, who);
  await searchableParents(dirname(dir));
  if (gid !== null) {
    try {
      await ownedDir(dir, gid);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EPERM') throw err;
      // Not root and not in the worker's group: keep the dirs our own and say what breaks.
      logger?.warn(
        { dir, user: who!.user },
        `cannot give group ${who!.user} the Nginx worker dir (not root?): its workers will get EACCES on the balancer sockets and the ACME webroot`,
      );
      gid = null;
    }
  }
  const out: WorkerDirs = {
    dir,
    socketDir: join(dir, SOCKETS_SUBDIR),
    acmeWebroot: join(dir, 'acme-webroot'),
    tempDir: join(dir, 'tmp'),
    gid,
  };
  for (const d of [dir, out.socketDir, out.acmeWebroot, out.tempDir]) await ownedDir(d, gid);
  // certbot writes the challenge files 0644 under these; the worker reads them by path.
  const challenges = join(out.acmeWebroot, '.well-known', 'acme-challenge');
  await mkdir(challenges, { recursive: true, mode: 0o755 });
  await chmod(join(out.acmeWebroot, '.well-known'), 0o755);
  await chmod(challenges, 0o755);
  return out;
}
