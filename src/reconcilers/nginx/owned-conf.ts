// The Nginx loop's view of the files it owns in its conf dir: their texts as last read, how often
// they are checked against the disk, and the hash of the whole set.
//
// Between two verifications a read trusts the cache for the files it holds: it lists the
// directory (a file added or removed is seen at once) and stats only new names, instead of every
// site on every pass. A hand edit of an owned file is found by the next verification, as the
// periodic resync finds drift. What the loop writes is forgotten (written()), so it is read back.

import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { readOwned, type OwnedFiles, type TextCache } from './apply.js';

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
    for (const name of names) this.#texts.delete(join(this.#dir, name));
    return readOwned(this.#dir, this.#texts, true);
  }

  hash(files: Map<string, string>): string {
    if (this.#hashed === null || !sameTexts(this.#hashed.files, files)) this.#hashed = { files, hash: configHash(files) };
    return this.#hashed.hash;
  }
}

/** The same names with the same texts (a text read once is the same string object: cheap). */
function sameTexts(a: Map<string, string>, b: Map<string, string>): boolean {
  if (a.size !== b.size) return false;
  for (const [name, text] of a) if (b.get(name) !== text) return false;
  return true;
}

function configHash(files: Map<string, string>): string {
  const h = createHash('sha256');
  for (const name of [...files.keys()].sort()) h.update(name).update('\0').update(files.get(name)!).update('\0');
  return h.digest('hex');
}
