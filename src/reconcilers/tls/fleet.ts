// The TLS loop's side of a fleet sharing its certificates (shared.ts): what each domain's
// certificate is (the stored one; the published copies when the store does not answer), and the
// order wrapped in the domain's issuer lock: whoever holds it orders, everyone else installs
// what it stores.

import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { dirname, join, relative } from 'node:path';
import type { Logger } from 'pino';
import type { ApplyResult, LoopContext } from '../types.js';
import type { CertFiles } from './cert-files.js';
import { checkCertificate, renewalTime, type CertCheck } from './certificate.js';
import type { AcmeSettings } from './certbot.js';
import { requeueUntil, type Issuer } from './issuer.js';
import type { AccountFiles, SharedCertificates, StoredCertificateInfo } from './shared.js';

/** While another gateway holds a domain's lock, look again this often (its NOTIFY comes first). */
export const LOCK_RETRY_MS = 5_000;

/** A stored certificate's check from its figures alone: the PEMs were checked when it was stored here. */
function figuresCheck(info: StoredCertificateInfo, now: number): CertCheck {
  if (now >= info.notAfter)
    return { ok: false, reason: 'Expired', message: `the certificate expired at ${new Date(info.notAfter).toISOString()}` };
  return { ok: true, info: { ...info, renewalTime: renewalTime(info.notBefore, info.notAfter) } };
}

/** Per domain, the serial whose PEMs were read and checked, and whether they were usable. */
export type CheckedSerials = Map<string, { serial: string; problem: CertCheck | null }>;

/**
 * Each domain's certificate for the plan. A serial already published here, or already read and
 * found usable, is judged by its figures; one not yet read is read whole and checked (the
 * database is input like any other), and one found unusable stays so. So a pass reads PEMs only
 * for what changed. When the store does not answer, the published copies stand in: the gateway
 * serves what it has and orders nothing (the lock would not answer either).
 */
export async function fleetLineages(
  shared: SharedCertificates,
  files: CertFiles,
  published: Map<string, Set<string>>,
  checked: CheckedSerials,
  now: number,
  logger: Logger,
): Promise<Map<string, CertCheck>> {
  const out = new Map<string, CertCheck>();
  let stored: Map<string, StoredCertificateInfo>;
  try {
    stored = await shared.list();
  } catch (err) {
    logger.warn({ err: (err as Error).message }, 'the certificate store does not answer; serving the certificates published here');
    for (const domain of published.keys()) {
      const copy = await files.newestCopy(domain, now);
      if (copy) out.set(domain, copy);
    }
    return out;
  }
  for (const domain of checked.keys()) if (!stored.has(domain)) checked.delete(domain);
  for (const [domain, info] of stored) {
    let seen = checked.get(domain);
    if (!published.get(domain)?.has(info.serial) && seen?.serial !== info.serial) {
      const { check } = await storedPair(shared, domain, now);
      seen = { serial: info.serial, problem: check.ok ? null : check };
      checked.set(domain, seen);
    }
    out.set(domain, seen?.serial === info.serial && seen.problem ? seen.problem : figuresCheck(info, now));
  }
  return out;
}

/** The stored certificate of `domain`, checked, with its PEMs when it is usable. */
export async function storedPair(
  shared: SharedCertificates,
  domain: string,
  now: number,
): Promise<{ check: CertCheck; certPem?: string; keyPem?: string }> {
  const c = await shared.get(domain);
  if (!c) return { check: { ok: false, reason: 'Missing', message: 'no certificate yet' } };
  const check = checkCertificate(c.certPem, c.keyPem, domain, now);
  if (!check.ok) return { check: { ...check, message: `the stored certificate is not usable: ${check.message}` } };
  return { check, certPem: c.certPem, keyPem: c.keyPem };
}

export interface FleetIssuerOptions {
  shared: SharedCertificates;
  files: CertFiles;
  issuer: Issuer;
  /** certbot's config dir: its accounts/ are restored from the store before an order. */
  configDir: string;
  report: (ctx: LoopContext, check: CertCheck | null, issuing: boolean) => Promise<void>;
}

/**
 * An issue or renew action in a fleet. Under the domain's lock, the store is read again: a
 * certificate another gateway stored meanwhile (or one this gateway obtained but could not store)
 * is installed without calling the CA; otherwise this gateway orders, with the fleet's account.
 */
export async function fleetAttempt(
  o: FleetIssuerOptions,
  domain: string,
  renew: boolean,
  acme: AcmeSettings,
  acmeKey: string,
  ctx: LoopContext,
): Promise<ApplyResult> {
  const lock = await o.shared.lock(domain);
  if (lock === null) {
    await o.report(ctx, await o.files.served(domain, ctx.clock.now()), true);
    return { requeueAfterMs: LOCK_RETRY_MS };
  }
  try {
    const now = ctx.clock.now();
    const stored = await storedPair(o.shared, domain, now);
    if (stored.check.ok && now < stored.check.info.renewalTime) {
      await o.files.publish(domain, stored.check.info.serial, stored.certPem!, stored.keyPem!);
      await o.report(ctx, stored.check, false);
      return requeueUntil(stored.check.info.renewalTime, now);
    }
    const local = await o.files.lineage(domain, now);
    if (local.ok && now < local.info.renewalTime && (!stored.check.ok || local.info.notAfter > stored.check.info.notAfter)) {
      await o.shared.put({ domain, ...local.info, certPem: local.certPem!, keyPem: local.keyPem!, acmeKey }, issuerName());
      await o.files.publish(domain, local.info.serial, local.certPem!, local.keyPem!);
      await o.report(ctx, local, false);
      return requeueUntil(local.info.renewalTime, now);
    }
    await restoreAccount(o.shared, o.configDir, acme.server, acmeKey);
    try {
      return await o.issuer.attempt(domain, renew, acme, acmeKey, ctx);
    } finally {
      await saveAccount(o.shared, o.configDir, acme.server, acmeKey).catch((err: unknown) =>
        ctx.logger.warn({ err: (err as Error).message }, 'could not store the ACME account for the fleet'),
      );
    }
  } finally {
    await lock.release();
  }
}

/** Who stored a certificate, for an operator reading the table (no secret in it). */
export function issuerName(): string {
  return `${hostname()} pid ${process.pid}`;
}

/** certbot's account directory for an ACME server: accounts/<host[:port]>/<path>. */
function accountDir(configDir: string, server: string): string {
  const u = new URL(server);
  return join(configDir, 'accounts', u.host, ...u.pathname.split('/').filter((p) => p !== '' && p !== '..' && p !== '.'));
}

/** The fleet's account for these settings replaces whatever account certbot has here for that server. */
async function restoreAccount(shared: SharedCertificates, configDir: string, server: string, acmeKey: string): Promise<void> {
  const files = await shared.account(acmeKey);
  if (!files) return;
  const dir = accountDir(configDir, server);
  await rm(dir, { recursive: true, force: true });
  for (const [path, text] of Object.entries(files)) {
    const target = join(dir, path);
    // Paths come from the database: nothing may land outside the account directory.
    if (relative(dir, target).startsWith('..') || !/^[A-Za-z0-9._/-]+$/.test(path)) continue;
    await mkdir(dirname(target), { recursive: true, mode: 0o700 });
    await writeFile(target, text, { mode: 0o600 });
  }
}

/** The account certbot registered here, stored for the fleet unless one is stored already. */
async function saveAccount(shared: SharedCertificates, configDir: string, server: string, acmeKey: string): Promise<void> {
  const dir = accountDir(configDir, server);
  const files: AccountFiles = {};
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) files[relative(dir, p)] = await readFile(p, 'utf8');
    }
  };
  await walk(dir);
  if (Object.keys(files).length > 0) await shared.saveAccount(acmeKey, files);
}
