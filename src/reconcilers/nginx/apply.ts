// The file side of the Nginx loop, as plain functions (the loop runs them as its stages):
//   readOwned  — the owned files (MARKER) of the conf dir, and the names of foreign ones;
//   diffFiles  — compare rendered files with them: one change per file that differs (pure);
//   applyFiles — write the changes into a candidate copy, `nginx -t` it, hold back the files
//                that fail (found from nginx's "in <file>:<line>", else by bisection), swap the
//                rest in atomically, reload once; a refused reload restores the previous files.

import { randomBytes } from 'node:crypto';
import { copyFile, link, mkdir, readFile, readdir, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join, normalize, relative } from 'node:path';
import type { Logger } from 'pino';
import { ProxyError } from '../../errors.js';
import { DEFAULT_TEMP_RE, writeAtomic as writeFileAtomic } from '../../write-atomic.js';
import { MARKER, SITES_SUBDIR } from './names.js';
import type { ReloadHint, ReloadOutcome, ReloadUnconfirmed, TestResult } from './nginx-process.js';

export { unifiedDiff } from './diff.js';

/** One file that differs between the render and the conf dir (names are relative to the conf dir). */
export type FileChange =
  | { kind: 'create'; name: string; text: string; previous: null }
  | { kind: 'update'; name: string; text: string; previous: string }
  | { kind: 'delete'; name: string; text: null; previous: string }
  /** The rendered name exists as a foreign file (no MARKER): skipped, never overwritten. */
  | { kind: 'conflict'; name: string; text: string; previous: null };

/** What the conf dir holds, as readOwned found it. */
export interface OwnedFiles {
  owned: Map<string, string>;
  /** *.conf files without our marker: never read further, overwritten or deleted. */
  foreign: Set<string>;
}

export interface ApplyFilesResult {
  applied: string[];
  heldBack: { file: string; message: string }[];
  reloaded: boolean;
  /** The reload failed and the previous files were restored (and reloaded again). */
  rolledBack?: boolean;
  /** Reloaded, but workers of the previous config still accepted at the deadline. */
  unconfirmed?: ReloadUnconfirmed;
}

export function isOwned(text: string): boolean {
  return text === MARKER || text.startsWith(`${MARKER}\n`);
}

/** Every *.conf in the conf dir and its sites/ subdir, by name relative to the conf dir. */
async function listConf(dir: string): Promise<string[]> {
  const names: string[] = [];
  for (const sub of ['', SITES_SUBDIR]) {
    const entries = await readdir(join(dir, sub), { withFileTypes: true }).catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT') return [];
      throw e;
    });
    for (const e of entries) if (e.isFile() && e.name.endsWith('.conf')) names.push(sub ? `${sub}/${e.name}` : e.name);
  }
  return names.sort();
}

/**
 * File text by path with the stat key it was read at (inode, size, nanosecond mtime): any edit,
 * ours or by hand, changes at least one, so a file whose key is unchanged need not be read
 * again. One per reader of a conf dir (the loop keeps its own); readOwned without one reads
 * every file.
 */
export type TextCache = Map<string, { key: string; text: string }>;

/**
 * Read the owned files of a conf dir; foreign files are only listed, their content is ignored.
 * With a cache, a resync of 10,000 unchanged sites costs 10,000 stats and no reads. With
 * `trustCache` too, a file the cache holds is taken from it without a stat: the directory
 * listing alone (files added or removed) is read, and only new names are stat'ed and read.
 */
export async function readOwned(dir: string, cache?: TextCache, trustCache = false): Promise<OwnedFiles> {
  const owned = new Map<string, string>();
  const foreign = new Set<string>();
  const names = await listConf(dir);
  const base = confBase(dir);
  const pathOf = (name: string): string => `${base}/${name}`;
  const texts: (string | undefined)[] = names.map((name) => (trustCache ? cache?.get(pathOf(name))?.text : undefined));
  const missing = names.flatMap((name, i) => (texts[i] === undefined ? [i] : []));
  const read = await mapLimit(missing, READ_CONCURRENCY, (i) => {
    const path = pathOf(names[i]!);
    return cache ? readCached(cache, path) : readFile(path, 'utf8');
  });
  missing.forEach((i, k) => (texts[i] = read[k]));
  // Entries of files no longer listed go; a cache no larger than the listing holds none.
  if (cache && cache.size > names.length) {
    const listed = new Set(names.map(pathOf));
    for (const path of cache.keys()) if (path.startsWith(`${base}/`) && !listed.has(path)) cache.delete(path);
  }
  names.forEach((name, i) => {
    const text = texts[i]!;
    if (isOwned(text)) owned.set(name, text);
    else foreign.add(name);
  });
  return { owned, foreign };
}

/**
 * The conf dir as the paths of a TextCache begin: names come from readdir (plus our sites/
 * prefix), so `${base}/${name}` is the joined path, and path.join per file per pass cost more
 * than the rest of a trusted read.
 */
export function confBase(dir: string): string {
  return normalize(dir).replace(/\/+$/, '');
}

/** Reads in flight at once: libuv's pool has 4 threads; more only queues. */
const READ_CONCURRENCY = 16;

async function readCached(cache: TextCache, path: string): Promise<string> {
  const st = await stat(path, { bigint: true });
  const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
  const hit = cache.get(path);
  if (hit?.key === key) return hit.text;
  const text = await readFile(path, 'utf8');
  cache.set(path, { key, text });
  return text;
}

/** Writes (and renames, links) in flight at once: enough to keep the pool's 4 threads busy. */
const WRITE_CONCURRENCY = 16;

async function forEachLimit<T>(items: readonly T[], limit: number, fn: (t: T) => Promise<unknown>): Promise<void> {
  await mapLimit(items, limit, fn);
}

async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/**
 * The changes that make the conf dir hold `rendered` (name relative to the conf dir → text):
 * creates, updates and conflicts in the order of `rendered`, then the deletes. Files equal to
 * their render are not listed.
 */
export function diffFiles(rendered: ReadonlyMap<string, string>, { owned, foreign }: OwnedFiles): FileChange[] {
  const changes: FileChange[] = [];
  for (const [name, text] of rendered) {
    if (name.includes('..') || name.startsWith('/')) throw new ProxyError('DP_ERR_INTERNAL', `bad file name ${name}`);
    if (foreign.has(name)) {
      changes.push({ kind: 'conflict', name, text, previous: null });
      continue;
    }
    const previous = owned.get(name);
    if (previous === undefined) changes.push({ kind: 'create', name, text, previous: null });
    else if (previous !== text) changes.push({ kind: 'update', name, text, previous });
  }
  for (const [name, previous] of owned) if (!rendered.has(name)) changes.push({ kind: 'delete', name, text: null, previous });
  return changes;
}

/**
 * Write a file as temp + rename, so a concurrent reload never sees it half-written. No fsync: a
 * pass may write thousands of site files, and a crash that loses one is repaired by the next pass,
 * which renders the same text again; until a reload passes `nginx -t`, Nginx keeps serving the
 * configuration it has loaded.
 */
export async function writeAtomic(path: string, text: string, makeDir = true): Promise<void> {
  await writeFileAtomic(path, text, { mode: 0o644, makeDir });
}

const TEMP_RE = DEFAULT_TEMP_RE;

/**
 * Remove what a crash in the middle of an apply leaves behind: candidate trees and candidate
 * main confs of an interrupted `nginx -t` (next to the conf dir and the main conf), and temp
 * files of writeAtomic in the conf dir. Only names this module makes are touched. Call it
 * before the first apply; the names are the ones withCandidate() and writeAtomic() use.
 */
export async function removeApplyLeftovers(sitesDir: string, mainConfPath: string): Promise<string[]> {
  const removed: string[] = [];
  const cand = new RegExp(`^\\.${escapeRe(basename(sitesDir))}\\.candidate-[0-9a-f]{8}$`);
  const scan = async (dir: string, match: (name: string, isDir: boolean) => boolean): Promise<void> => {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      if (!match(e.name, e.isDirectory())) continue;
      await rm(join(dir, e.name), { recursive: true, force: true });
      removed.push(join(dir, e.name));
    }
  };
  await scan(dirname(sitesDir), (name, isDir) => isDir && cand.test(name));
  await scan(dirname(mainConfPath), (name, isDir) => !isDir && /^\.dstack-proxy-candidate-[0-9a-f]{8}\.conf$/.test(name));
  for (const sub of ['', SITES_SUBDIR]) await scan(join(sitesDir, sub), (name, isDir) => !isDir && TEMP_RE.test(name));
  return removed;
}

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

async function removeFile(path: string): Promise<void> {
  await unlink(path).catch((e: NodeJS.ErrnoException) => {
    if (e.code !== 'ENOENT') throw e;
  });
}

export interface ApplyFilesOptions {
  /** diffFiles' answer, or any part of it. */
  changes: readonly FileChange[];
  /** The managed conf dir (global file + sites/), included by the main conf. */
  sitesDir: string;
  /** The main conf; it must include sitesDir by its literal path (the candidate copy swaps it). */
  mainConfPath: string;
  /** `nginx -t` of a main conf (e.g. testConfig with the private prefix). */
  test: (confPath: string) => Promise<TestResult>;
  /** Told how long the slowest `nginx -t` of this apply took: the master parses the same files. */
  reload: (hint?: ReloadHint) => Promise<ReloadOutcome>;
  /**
   * Test the changed sites alone: the candidate tree holds the changed site files, the files at
   * the conf dir's top (the global file) and the foreign files named here, not the unchanged
   * sites. Sound because sites do not depend on one another: every name a site declares (zones,
   * upstreams, server names) comes from its own service, which a valid document makes unique,
   * and what they share is in the global file, so a change to it tests the whole tree anyway.
   * The reload still parses everything, and a reload Nginx refuses rolls back as always.
   * Default: the whole tree.
   */
  changedOnly?: { foreign: ReadonlySet<string> };
  logger?: Logger;
}

export const CONFLICT_MESSAGE = 'a file without the dstack-proxy marker has this name: left alone';

/** A file to write: its new text, and what it held before (null: absent). */
type Change = { name: string; text: string; previous: string | null };
type Deletion = { name: string; previous: string };

/**
 * Apply changes: test the candidate tree, hold back files that fail, swap the rest in, reload
 * once. Conflicts are held back untouched; no writes and no deletes touch nothing.
 */
export async function applyFiles(opts: ApplyFilesOptions): Promise<ApplyFilesResult> {
  const { sitesDir, logger } = opts;
  const conflicts: { file: string; message: string }[] = [];
  const changes: Change[] = [];
  const deletes: Deletion[] = [];
  for (const c of opts.changes) {
    if (c.kind === 'conflict') conflicts.push({ file: c.name, message: CONFLICT_MESSAGE });
    else if (c.kind === 'delete') deletes.push({ name: c.name, previous: c.previous });
    else changes.push({ name: c.name, text: c.text, previous: c.previous });
  }
  if (changes.length + deletes.length === 0) return { applied: [], heldBack: conflicts, reloaded: false };

  return withCandidate(opts, changes, deletes, async (cand) => {
    // 1. Test: find the changes the candidate tree accepts.
    const selected = await selectGood(changes, cand.tryWith);
    const accepted = selected.accepted;
    const heldBack = [...conflicts, ...selected.heldBack];
    if (accepted === null) {
      const all = [...changes.map((c) => c.name), ...deletes.map((d) => d.name)];
      const message = `the config fails nginx -t without any change: ${selected.heldBack[0]?.message ?? ''}`;
      return { applied: [], heldBack: [...conflicts, ...all.map((file) => ({ file, message }))], reloaded: false };
    }
    if (accepted.length === 0 && deletes.length === 0) return { applied: [], heldBack, reloaded: false };

    // 2. Swap the accepted files into the real dir, remove deleted owned files.
    await cand.swapIn(accepted);
    await forEachLimit(deletes, WRITE_CONCURRENCY, (d) => removeFile(join(sitesDir, d.name)));
    const applied = [...accepted.map((c) => c.name), ...deletes.map((d) => d.name)];

    // 3. Reload once (the candidate is removed after); a refused reload restores the previous
    //    files and reloads again.
    try {
      const outcome = await opts.reload({ testMs: cand.slowestTestMs() });
      return { applied, heldBack, reloaded: true, ...(outcome ? { unconfirmed: outcome } : {}) };
    } catch (err) {
      const message = `reload failed: ${err instanceof Error ? err.message : String(err)}`;
      logger?.error({ err: message, files: applied }, 'nginx reload failed, rolling back');
      await forEachLimit(accepted, WRITE_CONCURRENCY, (c) =>
        c.previous === null ? removeFile(join(sitesDir, c.name)) : writeAtomic(join(sitesDir, c.name), c.previous),
      );
      await forEachLimit(deletes, WRITE_CONCURRENCY, (d) => writeAtomic(join(sitesDir, d.name), d.previous));
      try {
        await opts.reload({ testMs: cand.slowestTestMs() });
      } catch (err2) {
        logger?.error({ err: err2 instanceof Error ? err2.message : String(err2) }, 'nginx reload after rollback failed');
      }
      return { applied: [], heldBack: [...heldBack, ...applied.map((file) => ({ file, message }))], reloaded: false, rolledBack: true };
    }
  });
}

/**
 * Which changes can go in together. null when even the tree without any change fails (a broken
 * foreign file, say): then nothing can be applied safely.
 */
async function selectGood(
  changes: Change[],
  tryWith: (names: Set<string>) => Promise<TestResult & { relFile?: string }>,
): Promise<{ accepted: Change[] | null; heldBack: { file: string; message: string }[] }> {
  const heldBack: { file: string; message: string }[] = [];
  const accepted: Change[] = [];
  const first = await tryWith(new Set(changes.map((c) => c.name)));
  if (first.ok) return { accepted: changes, heldBack };
  const base = await tryWith(new Set());
  if (!base.ok) return { accepted: null, heldBack: [{ file: base.relFile ?? '', message: base.message }] };

  const search = async (cands: Change[], known?: TestResult & { relFile?: string }): Promise<void> => {
    if (cands.length === 0) return;
    const r = known ?? (await tryWith(new Set([...accepted, ...cands].map((c) => c.name))));
    if (r.ok) {
      accepted.push(...cands);
      return;
    }
    if (cands.length === 1) {
      heldBack.push({ file: cands[0]!.name, message: r.message });
      return;
    }
    // nginx names the file it choked on: hold that one back and retry the rest.
    const named = cands.find((c) => c.name === r.relFile);
    if (named) {
      heldBack.push({ file: named.name, message: r.message });
      await search(cands.filter((c) => c !== named));
      return;
    }
    const mid = Math.ceil(cands.length / 2);
    await search(cands.slice(0, mid));
    await search(cands.slice(mid));
  };
  await search(changes, first);
  return { accepted, heldBack };
}

interface Candidate {
  /** `nginx -t` of the candidate tree holding the changes in `names` (the others as before). */
  tryWith: (names: Set<string>) => Promise<TestResult & { relFile?: string }>;
  /** Moves the accepted changes into the real dir, each by one atomic rename. */
  swapIn: (accepted: Change[]) => Promise<void>;
  /** The longest `nginx -t` run so far, in ms. */
  slowestTestMs: () => number;
}

/**
 * Build a candidate copy of the conf dir (current files minus deletions) and a candidate main
 * conf including it; `fn` tries subsets of the changes on it and swaps the good ones in. Both
 * are removed afterwards.
 */
async function withCandidate<T>(
  opts: ApplyFilesOptions,
  changes: Change[],
  deletes: Deletion[],
  fn: (cand: Candidate) => Promise<T>,
): Promise<T> {
  const { sitesDir, mainConfPath } = opts;
  const mainText = await readFile(mainConfPath, 'utf8');
  if (!mainText.includes(sitesDir)) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${mainConfPath} does not include the managed dir ${sitesDir}`);
  }
  const id = randomBytes(4).toString('hex');
  const candDir = join(dirname(sitesDir), `.${basename(sitesDir)}.candidate-${id}`);
  const candConf = join(dirname(mainConfPath), `.dstack-proxy-candidate-${id}.conf`);
  try {
    await mkdir(join(candDir, SITES_SUBDIR), { recursive: true });
    const deleted = new Set(deletes.map((d) => d.name));
    // Hard links, not copies: 1,000 sites cost 1,000 link() calls instead of reads and
    // writes. A changed file is unlinked before it is written, so no original is touched.
    const all = (await listConf(sitesDir)).filter((name) => !deleted.has(name));
    const isSite = (name: string): boolean => name.startsWith(`${SITES_SUBDIR}/`);
    const foreign = changes.every((c) => isSite(c.name)) ? opts.changedOnly?.foreign : undefined;
    const partial = foreign !== undefined;
    const changed = new Set(changes.map((c) => c.name));
    const kept = partial ? all.filter((name) => !isSite(name) || changed.has(name) || foreign.has(name)) : all;
    // A test of part of the tree is quicker than the reload that parses all of it: the reload's
    // deadline is scaled as if the whole tree had been tested.
    const testScale = partial ? Math.max(1, (all.length + 1) / (new Set([...kept, ...changed]).size + 1)) : 1;
    await forEachLimit(kept, WRITE_CONCURRENCY, (name) =>
      link(join(sitesDir, name), join(candDir, name)).catch(() => copyFile(join(sitesDir, name), join(candDir, name))),
    );
    await writeFile(candConf, mainText.split(sitesDir).join(candDir));
    /** What the candidate holds for each change: its text, or its previous text (null: absent). */
    const state = new Map<string, string | null>(changes.map((c) => [c.name, c.previous]));
    let slowestTestMs = 0;
    const tryWith = async (names: Set<string>) => {
      const todo = changes.filter((c) => state.get(c.name) !== (names.has(c.name) ? c.text : c.previous));
      // Many small files: several writes in flight keep libuv's pool busy (1,000 sites, cold).
      await forEachLimit(todo, WRITE_CONCURRENCY, async (c) => {
        const want = names.has(c.name) ? c.text : c.previous;
        if (state.get(c.name) !== null) await removeFile(join(candDir, c.name)); // never write through a link
        if (want !== null) await writeFile(join(candDir, c.name), want, { mode: 0o644, flag: 'wx' });
        state.set(c.name, want);
      });
      const t0 = performance.now();
      const r = await opts.test(candConf);
      slowestTestMs = Math.max(slowestTestMs, (performance.now() - t0) * testScale);
      if (r.ok) return r;
      const relFile = r.file && r.file.startsWith(`${candDir}/`) ? relative(candDir, r.file) : undefined;
      const message = r.message.split(candDir).join(sitesDir);
      return relFile === undefined ? { ...r, message } : { ...r, message, relFile };
    };
    const swapIn = async (accepted: Change[]) => {
      const dirs = new Set(accepted.map((c) => dirname(join(sitesDir, c.name))));
      for (const dir of dirs) await mkdir(dir, { recursive: true });
      await forEachLimit(accepted, WRITE_CONCURRENCY, async (c) => {
        const to = join(sitesDir, c.name);
        // The candidate file was written whole before nginx -t read it: renaming it over the
        // real one is the same atomic swap as writeAtomic, without writing the text again.
        // A change whose candidate holds other text (bisection ended elsewhere) is written.
        if (state.get(c.name) === c.text) {
          const moved = await rename(join(candDir, c.name), to).then(
            () => true,
            () => false,
          );
          if (moved) return;
        }
        await writeAtomic(to, c.text, false);
      });
    };
    return await fn({ tryWith, swapIn, slowestTestMs: () => slowestTestMs });
  } finally {
    await rm(candDir, { recursive: true, force: true });
    await rm(candConf, { force: true });
  }
}
