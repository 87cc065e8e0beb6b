// What counts as having a certificate: the files exist, parse as X.509 (node:crypto), cover
// the domain, match the key, and are not expired; and when it is due for renewal (renewalTime:
// two thirds of its lifetime, cert-manager's default; policies.ts acts on it). Everything here
// is pure except readCertificate, which only reads two files.

import { createPrivateKey, X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';

export interface CertInfo {
  /** Hex, upper case, as X509Certificate prints it. */
  serial: string;
  notBefore: number;
  notAfter: number;
  /** notBefore + 2/3 of the lifetime: from then on the certificate is renewed. */
  renewalTime: number;
}

export type CertCheck = { ok: true; info: CertInfo } | { ok: false; reason: 'Missing' | 'Invalid' | 'Expired'; message: string };

/** The fraction of the lifetime after which a certificate is renewed. */
export const RENEW_AFTER_FRACTION = 2 / 3;

export function renewalTime(notBefore: number, notAfter: number): number {
  return notBefore + Math.floor((notAfter - notBefore) * RENEW_AFTER_FRACTION);
}

/** Checks a PEM certificate chain (leaf first) and its PEM private key for `domain` at `now`. */
export function checkCertificate(certPem: string, keyPem: string, domain: string, now: number): CertCheck {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(certPem);
  } catch (err) {
    return { ok: false, reason: 'Invalid', message: `the certificate does not parse: ${messageOf(err)}` };
  }
  if (cert.checkHost(domain, { subject: 'never' }) === undefined) {
    return { ok: false, reason: 'Invalid', message: `the certificate does not cover ${domain}` };
  }
  try {
    if (!cert.checkPrivateKey(createPrivateKey(keyPem))) {
      return { ok: false, reason: 'Invalid', message: 'the private key does not match the certificate' };
    }
  } catch (err) {
    return { ok: false, reason: 'Invalid', message: `the private key does not parse: ${messageOf(err)}` };
  }
  const notBefore = Date.parse(cert.validFrom);
  const notAfter = Date.parse(cert.validTo);
  if (!Number.isFinite(notBefore) || !Number.isFinite(notAfter) || notAfter <= notBefore) {
    return { ok: false, reason: 'Invalid', message: 'the certificate has no usable validity period' };
  }
  if (now >= notAfter) {
    return { ok: false, reason: 'Expired', message: `the certificate expired at ${new Date(notAfter).toISOString()}` };
  }
  return {
    ok: true,
    info: { serial: cert.serialNumber.toUpperCase(), notBefore, notAfter, renewalTime: renewalTime(notBefore, notAfter) },
  };
}

/** Reads and checks `certPath` + `keyPath`; a missing file is `Missing`, not an error. */
export async function readCertificate(
  certPath: string,
  keyPath: string,
  domain: string,
  now: number,
): Promise<CertCheck & { certPem?: string; keyPem?: string }> {
  let certPem: string;
  let keyPem: string;
  try {
    [certPem, keyPem] = await Promise.all([readFile(certPath, 'utf8'), readFile(keyPath, 'utf8')]);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { ok: false, reason: 'Missing', message: 'no certificate yet' };
    return { ok: false, reason: 'Invalid', message: `cannot read the certificate: ${messageOf(err)}` };
  }
  return { ...checkCertificate(certPem, keyPem, domain, now), certPem, keyPem };
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
