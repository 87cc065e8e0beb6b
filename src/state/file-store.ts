// state.json under the state directory: written atomically (temp file in the same
// directory, fsync, rename, fsync of the directory), mode 0600 in a 0700 directory.
// A missing file is generation 0; a corrupt one is an error naming the file — never an
// empty state, which would make the gateway tear every site down.

import { promises as fs } from 'node:fs';
import path from 'node:path';
import { ProxyError } from '../errors.js';
import { writeAtomic } from '../write-atomic.js';
import { SpecError, emptyState, formatIssue, hashSpec, parseJsonText, validate, type ProxyState } from '../spec/index.js';
import type { StateStore, StoredState, WriteOptions, WriteResult } from './store.js';

export const STATE_FILE = 'state.json';
const TEMP_PREFIX = '.state.json.tmp-';

export interface FileStoreOptions {
  stateDir: string;
  clock?: { now(): number };
  /** Fault injection for tests: runs after the temp file is durable, before the rename. */
  beforeRename?: (tempPath: string) => Promise<void> | void;
}

export async function openFileStore(options: FileStoreOptions): Promise<StateStore> {
  const { stateDir } = options;
  if (!stateDir) throw new ProxyError('DP_ERR_BAD_OPTION', 'stateDir is required');
  await fs.mkdir(stateDir, { recursive: true, mode: 0o700 });
  await fs.chmod(stateDir, 0o700);
  await removeStaleTemps(stateDir);
  const store = new FileStore(options);
  await store.read(); // a corrupt file fails at start, not at the first PUT
  return store;
}

class FileStore implements StateStore {
  private readonly file: string;
  private current: StoredState | undefined;
  /** Writes are serialised so If-Match and the no-op check see a settled generation. */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly options: FileStoreOptions) {
    this.file = path.join(options.stateDir, STATE_FILE);
  }

  async read(): Promise<StoredState> {
    this.current ??= await loadStateFile(this.file);
    return this.current;
  }

  write(state: ProxyState, options: WriteOptions = {}): Promise<WriteResult> {
    const run = this.queue.then(() => this.writeNow(state, options));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async writeNow(state: ProxyState, { ifMatch }: WriteOptions): Promise<WriteResult> {
    const current = await this.read();
    if (ifMatch !== undefined && ifMatch !== current.generation) {
      throw new ProxyError('DP_ERR_GENERATION_MISMATCH', `If-Match is ${ifMatch}; the current generation is ${current.generation}`, {
        generation: current.generation,
      });
    }
    const hash = hashSpec(state);
    if (hash === current.hash) return { ...current, changed: false };
    const next: StoredState = {
      generation: current.generation + 1,
      hash,
      state,
      updatedAt: new Date((this.options.clock ?? Date).now()).toISOString(),
    };
    await writeAtomic(this.file, serialise(next), {
      mode: 0o600,
      fsyncFile: true,
      fsyncDir: true,
      tempName: () => `${TEMP_PREFIX}${process.pid}-${Math.random().toString(36).slice(2)}`,
      beforeRename: this.options.beforeRename,
      mapError: writeError,
    });
    this.current = next;
    return { ...next, changed: true };
  }

  async close(): Promise<void> {
    await this.queue;
  }
}

function serialise(s: StoredState): string {
  const { apiVersion, kind, spec } = s.state;
  const doc = { apiVersion, kind, metadata: { generation: s.generation, hash: s.hash, updatedAt: s.updatedAt }, spec };
  return `${JSON.stringify(doc, null, 2)}\n`;
}

export async function loadStateFile(file: string): Promise<StoredState> {
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
      const state = emptyState();
      return { generation: 0, hash: hashSpec(state), state, updatedAt: '' };
    }
    throw new ProxyError('DP_ERR_STATE_CORRUPT', `cannot read ${file}: ${(err as Error).message}`, { file }, { cause: err });
  }
  const corrupt = (why: string): ProxyError => new ProxyError('DP_ERR_STATE_CORRUPT', `${file} is corrupt: ${why}`, { file });
  let raw: unknown;
  try {
    raw = parseJsonText(text, 'not JSON');
  } catch (err) {
    if (!(err instanceof SpecError)) throw err;
    throw corrupt(err.issues.map(formatIssue).join('; '));
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw corrupt('not a JSON object');
  const { metadata, ...doc } = raw as { metadata?: { generation?: unknown; hash?: unknown; updatedAt?: unknown } };
  const generation = metadata?.generation;
  if (typeof generation !== 'number' || !Number.isSafeInteger(generation) || generation < 1) {
    throw corrupt('metadata.generation is missing or not a positive integer');
  }
  const result = validate(doc);
  if (!result.ok) throw corrupt(result.errors.slice(0, 5).map(formatIssue).join('; '));
  const hash = hashSpec(result.state);
  if (metadata?.hash !== hash) {
    throw corrupt('metadata.hash does not match the document (edited by hand? PUT the document instead)');
  }
  const updatedAt = typeof metadata.updatedAt === 'string' ? metadata.updatedAt : '';
  return { generation, hash, state: result.state, updatedAt };
}

/** Storage refusing the write, as opposed to a bug: the operator can act on it. */
const STORAGE_ERRNOS: Record<string, string> = {
  ENOSPC: 'no space left on the device',
  EDQUOT: 'the disk quota is exhausted',
  EROFS: 'the file system is read-only',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EIO: 'an I/O error',
};

function writeError(file: string, err: unknown): unknown {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === undefined || !(code in STORAGE_ERRNOS)) return err;
  return new ProxyError(
    'DP_ERR_STATE_WRITE',
    `cannot write ${file}: ${STORAGE_ERRNOS[code]} (${code}); nothing was stored and the previous generation is still served`,
    { file, errno: code },
    { cause: err },
  );
}

/** Temp files left by a crash between write and rename: the old state.json is intact. */
async function removeStaleTemps(dir: string): Promise<void> {
  for (const name of await fs.readdir(dir)) {
    if (name.startsWith(TEMP_PREFIX)) await fs.rm(path.join(dir, name), { force: true });
  }
}
