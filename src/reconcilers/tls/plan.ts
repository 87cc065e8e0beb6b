// The TLS loop's plan, pure: what the policies see of a domain, and the action its decision
// becomes, with the summary `plan` shows.

import type { Action } from '../types.js';
import { attemptsInNextHour, type Limits } from './backoff.js';
import type { TlsDesired, TlsObserved, TlsPayload } from './loop.js';
import { decide, type DomainInput, type Trigger } from './policies.js';

/** What the policies see of one domain, from the observed facts (pure). */
export function domainInput(domain: string, desired: TlsDesired, observed: TlsObserved, limits: Limits): DomainInput {
  const lineage = observed.lineages.get(domain) ?? { ok: false as const, reason: 'Missing' as const, message: 'no certificate yet' };
  return {
    domain,
    now: observed.now,
    acmeKey: desired.acmeKey,
    lineage,
    published: lineage.ok && observed.published.get(domain)?.has(lineage.info.serial) === true,
    backoff: observed.backoff.domains[domain],
    orders: observed.backoff.orders,
    limits,
  };
}

/** The action for a domain's decision, or null when there is nothing to do (pure). */
export function actionFor(i: DomainInput, desired: TlsDesired, limits: Limits): Action<TlsPayload> | null {
  const d = decide(i);
  const { domain } = i;
  switch (d.action) {
    case 'none':
      return null;
    case 'publish':
      return {
        key: domain,
        kind: 'publish',
        summary: `serve the existing certificate for ${domain} (serial ${d.serial})`,
        payload: { domain },
      };
    case 'wait':
      return {
        key: domain,
        kind: 'wait',
        summary: attemptSummary(i, desired, d.trigger, d.hold.until, limits),
        payload: { domain, until: d.hold.until },
      };
    default:
      return {
        key: domain,
        kind: d.action,
        summary: attemptSummary(i, desired, d.trigger, null, limits),
        payload: { domain, acme: desired.acme, acmeKey: desired.acmeKey },
      };
  }
}

/** `request a certificate for d from S (why); next attempt at T; backoff allows n attempt(s) in the next hour`. */
function attemptSummary(i: DomainInput, desired: TlsDesired, t: Trigger, until: number | null, limits: Limits): string {
  const what = t.renew ? 'renew the certificate' : 'request a certificate';
  const when = until !== null ? `next attempt at ${new Date(until).toISOString()}` : 'now';
  const allowed = attemptsInNextHour(i.backoff, i.acmeKey, i.now, limits);
  return `${what} for ${i.domain} from ${desired.acme.server} (${t.message}); ${when}; backoff allows ${allowed} attempt(s) in the next hour`;
}
