// The Nginx loop's view of the files it owns in its conf dir: their texts as last read, how often
// they are checked against the disk, and the hash of the whole set (made of per-file digests).
//
// Between two verifications a read trusts the cache for the files it holds: it lists the
// directory (a file added or removed is seen at once) and stats only new names, instead of every
// site on every pass. A hand edit of an owned file is found by the next verification, as the
// periodic resync finds drift. What the loop writes is forgotten (written()), so it is read back.

import { createHash } from 'node:crypto';
import { confBase, readOwned, type OwnedFiles, type TextCache } from './apply.js';

export class OwnedConf {
  readonly #dir: string;
  readonly #verifyEveryMs: number;
  readonly #texts: TextCache = new Map();
  #verifiedAt = -Infinity;
  /** The config hash with the texts it was computed from: computed again only when one changed. */
  #hashed: { files: Map<string, string>; hash: string } | null = null;

  constructor(dir: string, verifyEveryMs: number) {
    this.#dir = dir;
    this.#verifyEveryMs = verifyEveryMs;
  }

  /** A pass's read: every owned file stat'ed when a verification is due (at `now`), else trusted. */
  read(now: number): Promise<OwnedFiles> {
    const verify = now - this.#verifiedAt >= this.#verifyEveryMs;
    if (verify) this.#verifiedAt = now;
    return readOwned(this.#dir, this.#texts, !verify);
  }

  /** Every owned file stat'ed, whatever the cadence. */
  verify(): Promise<OwnedFiles> {
    return readOwned(this.#dir, this.#texts);
  }

  /** After a batch wrote (or rolled back) `names`: they are read back, the rest is trusted. */
  async afterWrite(names: Iterable<string>): Promise<OwnedFiles> {
    const base = confBase(this.#dir);
    for (const name of names) this.#texts.delete(`${base}/${name}`);
    return readOwned(this.#dir, this.#texts, true);
  }

  hash(files: Map<string, string>): string {
    if (this.#hashed === null || !sameTexts(this.#hashed.files, files)) this.#hashed = { files, hash: this.#configHash(files) };
    return this.#hashed.hash;
  }

  /** Each file's digest, kept while its text is the same string. */
  readonly #digests = new Map<string, { text: string; digest: Buffer }>();

  /**
   * sha256 over the files' own digests in name order: a pass in which one site changed hashes
   * that site's text, not the whole config's.
   */
  #configHash(files: Map<string, string>): string {
    const names = [...files.keys()];
    // The reads list names sorted, so this is usually already in order.
    if (!isSorted(names)) names.sort();
    const digests = Buffer.allocUnsafe(32 * names.length);
    names.forEach((name, i) => {
      const text = files.get(name)!;
      let memo = this.#digests.get(name);
      if (memo?.text !== text) {
        memo = { text, digest: createHash('sha256').update(name).update('\0').update(text).digest() };
        this.#digests.set(name, memo);
      }
      memo.digest.copy(digests, 32 * i);
    });
    if (this.#digests.size > files.size) for (const name of this.#digests.keys()) if (!files.has(name)) this.#digests.delete(name);
    return createHash('sha256').update(digests).digest('hex');
  }
}

/** The same names with the same texts (a text read once is the same string object: cheap). */
function sameTexts(a: Map<string, string>, b: Map<string, string>): boolean {
  if (a.size !== b.size) return false;
  for (const [name, text] of a) if (b.get(name) !== text) return false;
  return true;
}

function isSorted(names: readonly string[]): boolean {
  for (let i = 1; i < names.length; i++) if (names[i - 1]! > names[i]!) return false;
  return true;
}
