// What the TLS loop does about one domain, decided from gathered facts by small pure policies,
// in the order the lists below give:
//
//   gather (observe: lineage, published copies, backoff file) → DomainInput
//   triggers: noCertificate → invalid → expired → nearingExpiry     does it need a certificate?
//     none fires: notPublished                                       serve the one it has?
//   holds:    dnsNotReady, backingOff, domainRateLimit, orderRateLimit   not before when?
//   → issue | renew (now) | wait (until the latest hold) | publish | nothing
//
// Waiting is a decision like any other: the plan says "wait until T" and the action only
// comes back at T; nothing is found out while applying. Everything here is pure.

import { hourlyHold, orderHold, scheduleHold, type DomainBackoff, type Limits } from './backoff.js';
import type { CertCheck } from './certificate.js';

/** What the policies see of one domain. */
export interface DomainInput {
  domain: string;
  now: number;
  /** Fingerprint of the ACME settings the document asks for now. */
  acmeKey: string;
  /** certbot's lineage for the domain, checked (`Missing` when there is none). */
  lineage: CertCheck;
  /** The lineage's certificate has a published copy (what Nginx serves). */
  published: boolean;
  backoff: DomainBackoff | undefined;
  /** Start times of recent ACME attempts, every domain's. */
  orders: readonly number[];
  limits: Limits;
}

/** Why the domain needs a certificate from the ACME server. */
export interface Trigger {
  reason: 'Missing' | 'Invalid' | 'Expired' | 'RenewalDue';
  message: string;
  /** A valid certificate is replaced (kind `renew`), rather than one obtained (`issue`). */
  renew: boolean;
}

/** Why an ACME attempt must not start before `until`. */
export interface Hold {
  reason: 'DNSNotReady' | 'BackingOff' | 'DomainRateLimit' | 'OrderRateLimit';
  until: number;
}

export type Decision =
  | { action: 'issue' | 'renew'; trigger: Trigger }
  | { action: 'wait'; trigger: Trigger; hold: Hold }
  | { action: 'publish'; serial: string }
  | { action: 'none' };

/** Triggers look only at the certificate and the time. */
export type TriggerPolicy = (i: Pick<DomainInput, 'lineage' | 'now'>) => Trigger | null;
export type HoldPolicy = (i: DomainInput) => Hold | null;

export const noCertificate: TriggerPolicy = (i) =>
  !i.lineage.ok && i.lineage.reason === 'Missing' ? { reason: 'Missing', message: i.lineage.message, renew: false } : null;

/** Files that do not parse, do not cover the domain, or do not match their key. */
export const invalid: TriggerPolicy = (i) =>
  !i.lineage.ok && i.lineage.reason === 'Invalid' ? { reason: 'Invalid', message: i.lineage.message, renew: false } : null;

export const expired: TriggerPolicy = (i) =>
  !i.lineage.ok && i.lineage.reason === 'Expired' ? { reason: 'Expired', message: i.lineage.message, renew: false } : null;

/** Two thirds of the lifetime passed (cert-manager's default): renew while it still serves. */
export const nearingExpiry: TriggerPolicy = (i) =>
  i.lineage.ok && i.now >= i.lineage.info.renewalTime
    ? {
        reason: 'RenewalDue',
        message: `two thirds of the lifetime passed at ${new Date(i.lineage.info.renewalTime).toISOString()}`,
        renew: true,
      }
    : null;

export const triggerPolicies: readonly TriggerPolicy[] = [noCertificate, invalid, expired, nearingExpiry];

/** A valid certificate that Nginx does not serve yet (obtained before a crash, or by hand). */
export function notPublished(i: DomainInput): Decision | null {
  return i.lineage.ok && !i.published ? { action: 'publish', serial: i.lineage.info.serial } : null;
}

/** The name did not resolve at the last check: look again at the re-check time. */
export const dnsNotReady: HoldPolicy = (i) => {
  const until = i.backoff?.lastReason === 'DNSNotReady' ? scheduleHold(i.backoff, i.acmeKey) : null;
  return until !== null && until > i.now ? { reason: 'DNSNotReady', until } : null;
};

/** Failed attempts: the schedule's next attempt time (1 min, 5 min, 15 min … 24 h). */
export const backingOff: HoldPolicy = (i) => {
  const until = i.backoff?.lastReason !== 'DNSNotReady' ? scheduleHold(i.backoff, i.acmeKey) : null;
  return until !== null && until > i.now ? { reason: 'BackingOff', until } : null;
};

/** At most `maxPerDomainPerHour` attempts for the domain in any sliding hour. */
export const domainRateLimit: HoldPolicy = (i) => {
  const until = hourlyHold(i.backoff, i.now, i.limits);
  return until !== null && until > i.now ? { reason: 'DomainRateLimit', until } : null;
};

/** At most `maxOrdersPer3h` attempts for all domains together in any sliding 3 h. */
export const orderRateLimit: HoldPolicy = (i) => {
  const until = orderHold(i.orders, i.now, i.limits);
  return until !== null && until > i.now ? { reason: 'OrderRateLimit', until } : null;
};

export const holdPolicies: readonly HoldPolicy[] = [dnsNotReady, backingOff, domainRateLimit, orderRateLimit];

/** The first trigger that fires, or null: the certificate is fine as it is. */
export function firstTrigger(
  i: Pick<DomainInput, 'lineage' | 'now'>,
  policies: readonly TriggerPolicy[] = triggerPolicies,
): Trigger | null {
  for (const p of policies) {
    const t = p(i);
    if (t) return t;
  }
  return null;
}

/** Why a certificate needs issuing or renewing at `now`, or null when it doesn't. */
export function needsIssuing(check: CertCheck, now: number): Trigger | null {
  return firstTrigger({ lineage: check, now });
}

/** The hold that ends last (every hold must be over); on a tie the first in the list. */
export function latestHold(i: DomainInput, policies: readonly HoldPolicy[] = holdPolicies): Hold | null {
  let latest: Hold | null = null;
  for (const p of policies) {
    const h = p(i);
    if (h && (latest === null || h.until > latest.until)) latest = h;
  }
  return latest;
}

/** What to do about one domain now. */
export function decide(i: DomainInput): Decision {
  const trigger = firstTrigger(i);
  if (!trigger) return notPublished(i) ?? { action: 'none' };
  const hold = latestHold(i);
  if (hold) return { action: 'wait', trigger, hold };
  return { action: trigger.renew ? 'renew' : 'issue', trigger };
}
