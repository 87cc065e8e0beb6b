// The TLS loop's decisions, one table row per situation: pure functions, no I/O, no clock.

import { describe, expect, it } from 'vitest';
import { DEFAULT_LIMITS, nextAllowed, recordDnsNotReady, recordFailure, type DomainBackoff } from '../../../src/reconcilers/tls/backoff.js';
import type { CertCheck } from '../../../src/reconcilers/tls/certificate.js';
import {
  backingOff,
  decide,
  dnsNotReady,
  domainRateLimit,
  expired,
  invalid,
  latestHold,
  nearingExpiry,
  noCertificate,
  notPublished,
  orderRateLimit,
  type Decision,
  type DomainInput,
} from '../../../src/reconcilers/tls/policies.js';
import { prng } from '../../helpers/prng.js';

const MIN = 60_000;
const HOUR = 60 * MIN;
const DAY = 24 * HOUR;
const T0 = Date.UTC(2025, 0, 1);

const valid = (notBefore = T0 - 10 * DAY, notAfter = T0 + 80 * DAY): CertCheck => ({
  ok: true,
  info: { serial: 'AB01', notBefore, notAfter, renewalTime: notBefore + Math.floor(((notAfter - notBefore) * 2) / 3) },
});
const missing: CertCheck = { ok: false, reason: 'Missing', message: 'no certificate yet' };
const broken: CertCheck = { ok: false, reason: 'Invalid', message: 'the certificate does not cover a.gw.test' };
const gone: CertCheck = { ok: false, reason: 'Expired', message: 'the certificate expired at …' };

function input(over: Partial<DomainInput> = {}): DomainInput {
  return {
    domain: 'a.gw.test',
    now: T0,
    acmeKey: 'k',
    lineage: missing,
    published: false,
    backoff: undefined,
    orders: [],
    limits: DEFAULT_LIMITS,
    ...over,
  };
}

const failedOnce = recordFailure(undefined, { at: T0 - 30_000, error: 'refused', acmeKey: 'k' }); // next at T0 + 30 s
const dnsChecked = recordDnsNotReady(undefined, { at: T0 - 10_000, error: 'nx', acmeKey: 'k' }); // next at T0 + 20 s
const fiveThisHour: DomainBackoff = {
  failedAttempts: 0,
  attempts: [T0 - 50 * MIN, T0 - 40 * MIN, T0 - 30 * MIN, T0 - 20 * MIN, T0 - 10 * MIN],
};
const fullOrders = Array.from({ length: 300 }, (_, i) => T0 - 2 * HOUR + i * 1_000);

describe('trigger policies', () => {
  it.each([
    ['noCertificate', noCertificate, missing, 'Missing'],
    ['invalid', invalid, broken, 'Invalid'],
    ['expired', expired, gone, 'Expired'],
  ] as const)('%s fires on its own problem only', (_name, policy, lineage, reason) => {
    expect(policy(input({ lineage }))).toEqual({ reason, message: (lineage as { message: string }).message, renew: false });
    for (const other of [missing, broken, gone, valid()].filter((l) => l !== lineage)) expect(policy(input({ lineage: other }))).toBeNull();
  });

  it('nearingExpiry fires from two thirds of the lifetime on, as a renewal', () => {
    const c = valid();
    const renewalTime = c.ok ? c.info.renewalTime : 0;
    expect(nearingExpiry(input({ lineage: c, now: renewalTime - 1 }))).toBeNull();
    expect(nearingExpiry(input({ lineage: c, now: renewalTime }))).toMatchObject({ reason: 'RenewalDue', renew: true });
    expect(nearingExpiry(input({ lineage: missing }))).toBeNull();
  });

  it('notPublished: a valid certificate without a published copy', () => {
    expect(notPublished(input({ lineage: valid(), published: false }))).toEqual({ action: 'publish', serial: 'AB01' });
    expect(notPublished(input({ lineage: valid(), published: true }))).toBeNull();
    expect(notPublished(input({ lineage: missing }))).toBeNull();
  });
});

describe('hold policies', () => {
  it.each([
    ['backingOff after a failure', backingOff, { backoff: failedOnce }, { reason: 'BackingOff', until: T0 + 30_000 }],
    ['backingOff ignores a schedule against other ACME settings', backingOff, { backoff: failedOnce, acmeKey: 'other' }, null],
    ['backingOff is over at its time', backingOff, { backoff: failedOnce, now: T0 + 30_000 }, null],
    ['backingOff leaves a DNS re-check to dnsNotReady', backingOff, { backoff: dnsChecked }, null],
    ['dnsNotReady until the re-check', dnsNotReady, { backoff: dnsChecked }, { reason: 'DNSNotReady', until: T0 + 20_000 }],
    [
      'dnsNotReady holds whatever the ACME settings',
      dnsNotReady,
      { backoff: dnsChecked, acmeKey: 'other' },
      { reason: 'DNSNotReady', until: T0 + 20_000 },
    ],
    ['dnsNotReady leaves failures to backingOff', dnsNotReady, { backoff: failedOnce }, null],
    [
      'domainRateLimit: five attempts in the hour',
      domainRateLimit,
      { backoff: fiveThisHour },
      { reason: 'DomainRateLimit', until: T0 + 10 * MIN },
    ],
    ['domainRateLimit: four are fine', domainRateLimit, { backoff: { ...fiveThisHour, attempts: fiveThisHour.attempts.slice(1) } }, null],
    ['orderRateLimit: 300 orders in 3 h', orderRateLimit, { orders: fullOrders }, { reason: 'OrderRateLimit', until: T0 + HOUR }],
    ['orderRateLimit: 299 are fine', orderRateLimit, { orders: fullOrders.slice(1) }, null],
  ] as const)('%s', (_name, policy, over, expected) => {
    expect(policy(input(over as Partial<DomainInput>))).toEqual(expected);
  });

  it('the hold that ends last wins; on a tie, the first in the chain', () => {
    const both: DomainBackoff = { ...failedOnce, attempts: fiveThisHour.attempts };
    expect(latestHold(input({ backoff: both }))).toEqual({ reason: 'DomainRateLimit', until: T0 + 10 * MIN });
    const tie: DomainBackoff = {
      ...fiveThisHour,
      failedAttempts: 1,
      lastReason: 'IssueFailed',
      acmeKey: 'k',
      nextAttemptTime: T0 + 10 * MIN,
    };
    expect(latestHold(input({ backoff: tie }))).toEqual({ reason: 'BackingOff', until: T0 + 10 * MIN });
    expect(latestHold(input())).toBeNull();
  });
});

describe('decide', () => {
  const c = valid();
  const renewalTime = c.ok ? c.info.renewalTime : 0;
  it.each<[string, Partial<DomainInput>, Decision['action'], string | null]>([
    ['no certificate yet → issue', {}, 'issue', 'Missing'],
    ['an invalid lineage → issue', { lineage: broken }, 'issue', 'Invalid'],
    ['an expired lineage → issue', { lineage: gone }, 'issue', 'Expired'],
    ['a valid, served certificate → nothing', { lineage: c, published: true }, 'none', null],
    ['a valid certificate not served yet → publish', { lineage: c, published: false }, 'publish', null],
    ['two thirds of the lifetime passed → renew', { lineage: c, published: true, now: renewalTime }, 'renew', 'RenewalDue'],
    [
      'renewal due, not served yet → renew (the new one is published)',
      { lineage: c, published: false, now: renewalTime },
      'renew',
      'RenewalDue',
    ],
    ['no certificate, backing off → wait', { backoff: failedOnce }, 'wait', 'Missing'],
    [
      'renewal due, backing off → wait',
      { lineage: c, published: true, now: renewalTime, backoff: { ...failedOnce, nextAttemptTime: renewalTime + MIN } },
      'wait',
      'RenewalDue',
    ],
    ['a served certificate is never held back by a backoff', { lineage: c, published: true, backoff: failedOnce }, 'none', null],
    ['DNS re-check not due → wait', { backoff: dnsChecked }, 'wait', 'Missing'],
    ['DNS re-check due → issue', { backoff: dnsChecked, now: T0 + 20_000 }, 'issue', 'Missing'],
    ['the order budget is spent → wait', { orders: fullOrders }, 'wait', 'Missing'],
  ])('%s', (_name, over, action, reason) => {
    const d = decide(input(over));
    expect(d.action).toBe(action);
    expect('trigger' in d ? d.trigger.reason : null).toBe(reason);
  });

  it('waits exactly until nextAllowed says the next attempt may start', () => {
    const seed = 20261201;
    const random = prng(seed);
    for (let n = 0; n < 2_000; n++) {
      const now = T0 + Math.floor(random() * 4 * HOUR);
      const attempts = Array.from({ length: Math.floor(random() * 7) }, () => now - Math.floor(random() * 2 * HOUR));
      const keyOf = () => (random() < 0.7 ? 'k' : 'other');
      const entry: DomainBackoff | undefined =
        random() < 0.2
          ? undefined
          : {
              failedAttempts: Math.floor(random() * 4),
              attempts,
              ...(random() < 0.8 ? { nextAttemptTime: now + Math.floor((random() - 0.4) * HOUR) } : {}),
              ...(random() < 0.5 ? { lastReason: random() < 0.5 ? ('DNSNotReady' as const) : ('IssueFailed' as const) } : {}),
              ...(random() < 0.9 ? { acmeKey: keyOf() } : {}),
            };
      const orders = random() < 0.1 ? fullOrders.map((t) => t + (now - T0)) : [];
      const limits = { ...DEFAULT_LIMITS, maxPerDomainPerHour: 1 + Math.floor(random() * 5) };
      const i = input({ now, backoff: entry, orders, limits });
      const next = nextAllowed(entry, orders, 'k', now, limits);
      const d = decide(i);
      if (next.at > now) expect(d, `seed ${seed}, draw ${n}`).toMatchObject({ action: 'wait', hold: { until: next.at } });
      else expect(d.action, `seed ${seed}, draw ${n}`).toBe('issue');
    }
  });
});
