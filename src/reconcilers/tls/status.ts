// The TLS loop's per-domain status: conditions `Ready` and `Issuing` (V1Condition shape) for
// people, whose messages spell out the figures (serial, notAfter, renewalTime, failedAttempts,
// lastFailureTime, nextAttemptTime, last error), and the same figures as typed outputs
// (CertificateOutputs) for code: Nginx, metrics and the CLI read those, never a message.

import { join } from 'node:path';
import type { CertificateOutputs } from '../outputs.js';
import type { StatusWriter } from '../types.js';
import type { DomainBackoff } from './backoff.js';
import type { CertCheck, CertInfo } from './certificate.js';

export { TLS_LOOP } from '../outputs.js';

/** Everything the loop knows about one domain, for status, metrics and dry-run. */
export interface DomainInfo {
  domain: string;
  /** The certificate being served, when there is a valid one. */
  cert: CertInfo | null;
  /** Why there is no valid certificate (Missing, Invalid, Expired), when there is none. */
  certProblem?: string;
  issuing: boolean;
  failedAttempts: number;
  lastFailureTime?: number;
  nextAttemptTime?: number;
  lastError?: string;
  lastReason?: 'IssueFailed' | 'DNSNotReady';
}

export interface ConditionPair {
  ready: { type: 'Ready'; status: 'True' | 'False'; reason: string; message: string };
  issuing: { type: 'Issuing'; status: 'True' | 'False'; reason: string; message: string };
}

export function domainInfo(domain: string, check: CertCheck | null, backoff: DomainBackoff | undefined, issuing: boolean): DomainInfo {
  const info: DomainInfo = { domain, cert: check?.ok ? check.info : null, issuing, failedAttempts: backoff?.failedAttempts ?? 0 };
  if (check && !check.ok) info.certProblem = check.message;
  if (backoff?.lastFailureTime !== undefined) info.lastFailureTime = backoff.lastFailureTime;
  if (backoff?.nextAttemptTime !== undefined) info.nextAttemptTime = backoff.nextAttemptTime;
  if (backoff?.lastError !== undefined) info.lastError = backoff.lastError;
  if (backoff?.lastReason !== undefined) info.lastReason = backoff.lastReason;
  return info;
}

const iso = (t: number): string => new Date(t).toISOString();

/** The figures of a failure: `failedAttempts 2; lastFailureTime …; nextAttemptTime …; error …`. */
export function failureFigures(i: DomainInfo): string {
  const parts = [`failedAttempts ${i.failedAttempts}`];
  if (i.lastFailureTime !== undefined) parts.push(`lastFailureTime ${iso(i.lastFailureTime)}`);
  if (i.nextAttemptTime !== undefined) parts.push(`nextAttemptTime ${iso(i.nextAttemptTime)}`);
  if (i.lastError) parts.push(`error ${i.lastError}`);
  return parts.join('; ');
}

export function certFigures(c: CertInfo): string {
  return `serial ${c.serial}; notAfter ${iso(c.notAfter)}; renewalTime ${iso(c.renewalTime)}`;
}

/** The two conditions for what is known about a domain (pure). */
export function domainConditions(i: DomainInfo): ConditionPair {
  const failing = i.lastReason !== undefined;
  const ready: ConditionPair['ready'] = i.cert
    ? { type: 'Ready', status: 'True', reason: 'Issued', message: certFigures(i.cert) }
    : failing
      ? { type: 'Ready', status: 'False', reason: i.lastReason!, message: failureFigures(i) }
      : { type: 'Ready', status: 'False', reason: 'Pending', message: i.certProblem ?? 'no certificate yet' };
  const issuing: ConditionPair['issuing'] = i.issuing
    ? { type: 'Issuing', status: 'True', reason: i.cert ? 'Renewing' : 'Requesting', message: 'certbot is running' }
    : failing
      ? {
          type: 'Issuing',
          status: 'False',
          reason: i.lastReason === 'DNSNotReady' ? 'DNSNotReady' : 'BackingOff',
          message: failureFigures(i),
        }
      : {
          type: 'Issuing',
          status: 'False',
          reason: 'Idle',
          message: i.cert ? `next renewal at ${iso(i.cert.renewalTime)}` : 'waiting for the next pass',
        };
  return { ready, issuing };
}

/** Where a published certificate and its key are. */
export interface PublishedPaths {
  certPath: string;
  keyPath: string;
}

/**
 * Where the published copy of a domain's certificate lives. The serial is part of the path, so
 * a renewal changes the Nginx site text and the Nginx loop reloads.
 */
export function publishedPaths(certsDir: string, domain: string, serial: string): PublishedPaths {
  const dir = join(certsDir, domain, serial);
  return { certPath: join(dir, 'fullchain.pem'), keyPath: join(dir, 'privkey.pem') };
}

/** The typed outputs for what is known about a domain (pure): the served copy's paths, or nulls. */
export function certificateOutputsOf(i: DomainInfo, certsDir: string): CertificateOutputs {
  const paths = i.cert ? publishedPaths(certsDir, i.domain, i.cert.serial) : null;
  return {
    serial: i.cert?.serial ?? null,
    certPath: paths?.certPath ?? null,
    keyPath: paths?.keyPath ?? null,
    notAfter: i.cert ? iso(i.cert.notAfter) : null,
    renewalTime: i.cert ? iso(i.cert.renewalTime) : null,
    failedAttempts: i.failedAttempts,
    nextAttemptTime: i.nextAttemptTime !== undefined ? iso(i.nextAttemptTime) : null,
    lastError: i.lastError ?? null,
  };
}

/** A domain's status: outputs first, so a reader never sees Ready=True next to the outputs of an older state. */
export function reportDomain(status: StatusWriter, info: DomainInfo, certsDir: string): void {
  status.setOutputs(info.domain, certificateOutputsOf(info, certsDir));
  const { ready, issuing } = domainConditions(info);
  status.set(info.domain, ready);
  status.set(info.domain, issuing);
}
