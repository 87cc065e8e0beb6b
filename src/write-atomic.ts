// Replace a file so that a reader sees the old text or the new one, never half of it: write a
// temp file in the same directory (a rename is atomic only within one file system), then rename
// it over the target. A failure before the rename removes the temp and leaves the target as it was.
//
// Durability is the caller's choice, because it costs a disk flush per call:
//   - fsyncFile: the temp's data reaches the disk before the rename, so a crash right after the
//     rename cannot leave the target empty or truncated;
//   - fsyncDir: the directory is flushed after the rename, so a crash cannot undo the rename
//     itself (the old file would come back). Only for a file whose loss would be noticed: the
//     stored desired state.

import { randomBytes } from 'node:crypto';
import { mkdir, open, rename, rm, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

export interface WriteAtomicOptions {
  /** Mode the file is created with (the umask still applies). Default 0600. */
  mode?: number;
  /** Create the target's directory (recursively) first. Default false: it must exist. */
  makeDir?: boolean;
  /** Mode of directories makeDir creates (the umask still applies). Default 0777. */
  dirMode?: number;
  /** fsync the temp file before the rename. */
  fsyncFile?: boolean;
  /** fsync the directory after the rename. */
  fsyncDir?: boolean;
  /** The temp's name (in the target's directory) for a target named `base`; default `.<base>.<8 hex>.tmp`. */
  tempName?: (base: string) => string;
  /** Fault injection for tests: runs after the temp is written (and synced), before the rename. */
  beforeRename?: (tempPath: string) => Promise<void> | void;
  /**
   * Turns a failure into the error thrown; `path` is the target, or its directory when the
   * directory's fsync failed (the rename has then happened). Default: the error unchanged.
   */
  mapError?: (path: string, err: unknown) => unknown;
}

/** The temp name writeAtomic uses by default, for callers that clean up after a crash. */
export const DEFAULT_TEMP_RE = /^\..+\.[0-9a-f]{8}\.tmp$/;

const defaultTempName = (base: string): string => `.${base}.${randomBytes(4).toString('hex')}.tmp`;

/**
 * `content`: a text (written as UTF-8), or byte chunks written in order with one gathered write
 * (a caller that keeps the unchanged parts of a large file encoded hands them over as they are).
 */
export async function writeAtomic(path: string, content: string | readonly Buffer[], options: WriteAtomicOptions = {}): Promise<void> {
  const { mode = 0o600, fsyncFile = false, fsyncDir = false, mapError = (_p: string, e: unknown) => e } = options;
  const dir = dirname(path);
  const temp = join(dir, (options.tempName ?? defaultTempName)(basename(path)));
  try {
    if (options.makeDir) await mkdir(dir, { recursive: true, mode: options.dirMode });
    const handle = await open(temp, 'wx', mode);
    try {
      if (typeof content === 'string') await handle.writeFile(content, 'utf8');
      else await writeChunks(handle, content);
      if (fsyncFile) await handle.sync();
    } finally {
      await handle.close();
    }
    await options.beforeRename?.(temp);
    await rename(temp, path);
  } catch (err) {
    await rm(temp, { force: true }).catch(() => undefined);
    throw mapError(path, err);
  }
  if (fsyncDir) {
    await syncDir(dir).catch((err: unknown) => {
      throw mapError(dir, err);
    });
  }
}

/** Every chunk, in order, from the file's start; a short write goes on where it stopped. */
async function writeChunks(handle: FileHandle, chunks: readonly Buffer[]): Promise<void> {
  let rest = chunks.filter((c) => c.length > 0);
  let position = 0;
  while (rest.length > 0) {
    const { bytesWritten } = await handle.writev(rest, position);
    position += bytesWritten;
    let skip = bytesWritten;
    let i = 0;
    while (i < rest.length && skip >= rest[i]!.length) skip -= rest[i++]!.length;
    rest = rest.slice(i);
    if (skip > 0) rest[0] = rest[0]!.subarray(skip);
  }
}

async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}
