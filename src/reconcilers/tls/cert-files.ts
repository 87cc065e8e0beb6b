// The certificate files of the TLS loop: certbot's lineages (what it obtained) and the copies
// published where Nginx reads them, a directory per serial so a reload never reads half a pair.

import { chmod, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { readCertificate, type CertCheck } from './certificate.js';
import { publishedPaths } from './status.js';

export class CertFiles {
  /**
   * `configDir`: certbot's (its live/ lineages); `certsDir`: where copies are published for Nginx.
   * `servedFromCopies`: what is served is judged by the published copies alone (a gateway of a
   * fleet installs certificates another one obtained: it has no lineage of its own).
   */
  constructor(
    private readonly configDir: string,
    readonly certsDir: string,
    private readonly servedFromCopies = false,
  ) {}

  /** The lineage's certificate as certbot left it, checked for `domain` at `now`. */
  lineage(domain: string, now: number): Promise<CertCheck & { certPem?: string; keyPem?: string }> {
    const dir = join(this.configDir, 'live', domain);
    return readCertificate(join(dir, 'fullchain.pem'), join(dir, 'privkey.pem'), domain, now);
  }

  /** The domains with a lineage. */
  lineageDomains(): Promise<string[]> {
    return listDirs(join(this.configDir, 'live'));
  }

  /** Per domain with a published copy, the serials published. */
  async published(): Promise<Map<string, Set<string>>> {
    const out = new Map<string, Set<string>>();
    for (const domain of await listDirs(this.certsDir)) {
      out.set(domain, new Set((await listDirs(join(this.certsDir, domain))).filter((s) => !s.includes('.tmp-'))));
    }
    return out;
  }

  /** The lineage's certificate when it is valid and published (what Nginx serves), else null. */
  async served(domain: string, now: number): Promise<CertCheck | null> {
    if (this.servedFromCopies) return this.newestCopy(domain, now);
    const c = await this.lineage(domain, now);
    return c.ok && (await exists(publishedPaths(this.certsDir, domain, c.info.serial).certPath)) ? c : null;
  }

  /** The valid published copy of `domain` that expires last, or null. */
  async newestCopy(domain: string, now: number): Promise<(CertCheck & { ok: true }) | null> {
    let best: (CertCheck & { ok: true }) | null = null;
    for (const serial of await listDirs(join(this.certsDir, domain))) {
      if (serial.includes('.tmp-')) continue;
      const p = publishedPaths(this.certsDir, domain, serial);
      const { certPem: _c, keyPem: _k, ...c } = await readCertificate(p.certPath, p.keyPath, domain, now);
      if (c.ok && c.info.serial === serial && (best === null || c.info.notAfter > best.info.notAfter)) best = c;
    }
    return best;
  }

  /** A copy of the pair under its serial (written aside, then renamed); the two newest are kept. */
  async publish(domain: string, serial: string, certPem: string, keyPem: string): Promise<void> {
    const target = join(this.certsDir, domain, serial);
    if (await exists(target)) return;
    await mkdir(join(this.certsDir, domain), { recursive: true, mode: 0o700 });
    const tmp = `${target}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { mode: 0o700 });
    await writeFile(join(tmp, 'fullchain.pem'), certPem, { mode: 0o644 });
    await writeFile(join(tmp, 'privkey.pem'), keyPem, { mode: 0o600 });
    await chmod(join(tmp, 'privkey.pem'), 0o600);
    await rename(tmp, target);
    // Keep the current and the previous copy (Nginx may serve the previous until its reload).
    const entries = await readdir(join(this.certsDir, domain));
    const dated = await Promise.all(
      entries.filter((e) => !e.includes('.tmp-')).map(async (e) => ({ e, t: (await stat(join(this.certsDir, domain, e))).mtimeMs })),
    );
    dated.sort((a, b) => b.t - a.t);
    for (const { e } of dated.slice(2)) if (e !== serial) await rm(join(this.certsDir, domain, e), { recursive: true, force: true });
  }

  /** Every published copy of `domain`. */
  unpublish(domain: string): Promise<void> {
    return rm(join(this.certsDir, domain), { recursive: true, force: true });
  }
}

async function listDirs(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir, { withFileTypes: true }))
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}
