// state.json under the state directory: written atomically (temp file in the same
// directory, fsync, rename, fsync of the directory), mode 0600 in a 0700 directory; writes that
// arrive while one is being made durable share the next one (group commit, see FileStore).
// A missing file is generation 0; a corrupt one is an error naming the file — never an
// empty state, which would make the gateway tear every site down.

import { promises as fs } from 'node:fs';
import path from 'node:path';
import { ProxyError } from '../errors.js';
import { writeAtomic } from '../write-atomic.js';
import {
  SpecError,
  emptyState,
  formatIssue,
  hashSpec,
  parseJsonText,
  specChunks,
  validate,
  wholeTextHash,
  type ProxyState,
} from '../spec/index.js';
import { mismatch, type StateStore, type StoredState, type WriteOptions, type WriteResult } from './store.js';

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
  // A corrupt file fails at start, not at the first PUT.
  return new FileStore(options, await loadStateFile(path.join(stateDir, STATE_FILE)));
}

/** Writes accepted in memory that one file write will make durable, and their callers. */
interface Group {
  done: Promise<void>;
  settle: (err?: unknown) => void;
}

function newGroup(): Group {
  let settle!: (err?: unknown) => void;
  const done = new Promise<void>((resolve, reject) => {
    settle = (err) => (err === undefined ? resolve() : reject(err));
  });
  // A group nobody waits on any more (every caller gone) must not be an unhandled rejection.
  done.catch(() => undefined);
  return { done, settle };
}

/**
 * Group commit. A write is decided at once against the newest accepted generation (If-Match,
 * the no-op check, generation + 1), in call order, so the sequence of generations is the one a
 * write-at-a-time store would produce. Its bytes reach the disk with the next file write:
 * writes that arrive while one is in flight wait for it, then share a single write + fsync of
 * the newest state, which covers all of them. Nobody is answered before the write covering
 * its generation is durable; if that write fails, every write of its group and every write
 * accepted after it (they built on the lost generations) fail with the same error, and the
 * store goes back to the generation on disk. A refused If-Match changes nothing and is
 * answered at once, naming the newest accepted generation.
 */
class FileStore implements StateStore {
  private readonly file: string;
  /** The newest generation on disk: what read() answers. */
  private durable: StoredState;
  /** The newest accepted generation: what If-Match and the no-op check compare with. */
  private accepted: StoredState;
  /** The file write in progress and the generations it covers. */
  private writing: Group | undefined;
  /** Generations accepted since that write started: the next file write covers them. */
  private waiting: Group | undefined;

  constructor(
    private readonly options: FileStoreOptions,
    loaded: StoredState,
  ) {
    this.file = path.join(options.stateDir, STATE_FILE);
    this.durable = loaded;
    this.accepted = loaded;
  }

  /** The stored document, once every write accepted before this call has settled. */
  async read(): Promise<StoredState> {
    await this.pending()?.done.catch(() => undefined);
    return this.durable;
  }

  write(state: ProxyState, { ifMatch }: WriteOptions = {}): Promise<WriteResult> {
    const current = this.accepted;
    if (ifMatch !== undefined && ifMatch !== current.generation) return Promise.reject(mismatch(ifMatch, current.generation));
    const hash = hashSpec(state);
    if (hash === current.hash) {
      // The answer names a generation: it waits until that one is on disk (and fails if it never gets there).
      const same: WriteResult = { ...current, changed: false };
      return this.pending()?.done.then(() => same) ?? Promise.resolve(same);
    }
    const next: StoredState = {
      generation: current.generation + 1,
      hash,
      state,
      updatedAt: new Date((this.options.clock ?? Date).now()).toISOString(),
    };
    this.accepted = next;
    const group = (this.waiting ??= newGroup());
    // On the next microtask, so writes made in the same turn share the file write too.
    if (!this.writing) queueMicrotask(() => this.startWrite());
    const changed: WriteResult = { ...next, changed: true };
    return group.done.then(() => changed);
  }

  async close(): Promise<void> {
    await this.read();
  }

  /** The group whose file write will cover the newest accepted generation, if that is not on disk yet. */
  private pending(): Group | undefined {
    return this.waiting ?? this.writing;
  }

  private startWrite(): void {
    if (this.writing || !this.waiting) return;
    const group = this.waiting;
    const target = this.accepted;
    this.waiting = undefined;
    this.writing = group;
    this.writeFile(target).then(
      () => {
        this.durable = target;
        this.writing = undefined;
        group.settle();
        this.startWrite();
      },
      (err: unknown) => {
        const later = this.waiting;
        this.writing = undefined;
        this.waiting = undefined;
        this.accepted = this.durable;
        group.settle(err);
        later?.settle(err);
      },
    );
  }

  private writeFile(s: StoredState): Promise<void> {
    return writeAtomic(this.file, serialise(s), {
      mode: 0o600,
      fsyncFile: true,
      fsyncDir: true,
      tempName: () => `${TEMP_PREFIX}${process.pid}-${Math.random().toString(36).slice(2)}`,
      beforeRename: this.options.beforeRename,
      mapError: writeError,
    });
  }
}

/**
 * The stored file: the header a field a line, then the spec with a service a line. Each
 * service's bytes are kept per service object, so a write in which one service changed encodes
 * that one and hands the kernel the rest as they are; pretty-printing the whole document
 * instead cost more than everything else a write does.
 */
function serialise(s: StoredState): Buffer[] {
  const { apiVersion, kind, spec } = s.state;
  const metadata = { generation: s.generation, hash: s.hash, updatedAt: s.updatedAt };
  const head = `{\n"apiVersion": ${JSON.stringify(apiVersion)},\n"kind": ${JSON.stringify(kind)},\n"metadata": ${JSON.stringify(metadata)},\n"spec": `;
  return [Buffer.from(head, 'utf8'), ...specChunks(spec, ',\n'), Buffer.from('\n}\n', 'utf8')];
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
  // A file written before services were hashed on their own carries the whole-text hash; it
  // proves the same, and the next write stores the current form.
  if (metadata?.hash !== hash && metadata?.hash !== wholeTextHash(result.state)) {
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

/**
 * Temp files left by a crash between write and rename: the old state.json is intact. A temp of
 * a live process (a gateway this one takes over from, writing) is its own, and left alone.
 */
async function removeStaleTemps(dir: string): Promise<void> {
  for (const name of await fs.readdir(dir)) {
    if (!name.startsWith(TEMP_PREFIX)) continue;
    const pid = Number.parseInt(name.slice(TEMP_PREFIX.length), 10);
    if (pid !== process.pid && alive(pid)) continue;
    await fs.rm(path.join(dir, name), { force: true });
  }
}

/** Whether a process of that pid exists (one of another user's counts too). */
function alive(pid: number): boolean {
  if (!(pid > 0)) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
