// An issue or renew action of the TLS loop: the order budget, the DNS pre-flight, then one
// certbot run whose outcome is judged by the certificate it leaves on disk, recorded in the
// backoff file, published and reported.

import type { ApplyResult, LoopContext } from '../types.js';
import {
  DOMAIN_WINDOW_MS,
  DNS_RETRY_MS,
  nextAllowed,
  orderHold,
  recordDnsNotReady,
  recordFailure,
  type Backoff,
  type Limits,
} from './backoff.js';
import type { AcmeSettings, CertbotDirs, CertbotRunner } from './certbot.js';
import type { CertFiles } from './cert-files.js';
import type { CertInfo } from './certificate.js';
import { domainInfo, reportDomain } from './status.js';

export interface IssuerOptions {
  files: CertFiles;
  backoff: Backoff;
  certbot: CertbotRunner;
  certbotDirs: CertbotDirs;
  /** The webroot Nginx serves /.well-known/acme-challenge/ from. */
  acmeWebroot: string;
  limits: Limits;
  /** Resolves a name or throws; null: no DNS pre-flight. */
  resolve: ((domain: string) => Promise<unknown>) | null;
  /** A fleet's: key authorizations go to its store through certbot's hooks. */
  sharedChallenges?: { env: Record<string, string> };
  /** Runs with each new certificate before it is published here (a fleet stores it). */
  onIssued?: (domain: string, cert: { info: CertInfo; certPem: string; keyPem: string }, acmeKey: string) => Promise<void>;
}

/** What certbot says when another certbot process holds its lock on the same directories. */
const CERTBOT_BUSY = /Another instance of Certbot is already running/i;
/** How soon a run refused by certbot's lock is tried again. */
export const CERTBOT_BUSY_RETRY_MS = 5_000;

/** A day: the resync covers anything later. */
const MAX_REQUEUE_MS = 24 * 60 * 60_000;

export function requeueUntil(renewalTime: number, now: number): ApplyResult {
  return { requeueAfterMs: Math.min(MAX_REQUEUE_MS, Math.max(1_000, renewalTime - now)) };
}

export class Issuer {
  readonly #o: IssuerOptions;

  constructor(o: IssuerOptions) {
    this.#o = o;
  }

  /** An issue or renew action: the order budget, the DNS pre-flight, then one certbot run. */
  async attempt(domain: string, renew: boolean, acme: AcmeSettings, acmeKey: string, ctx: LoopContext): Promise<ApplyResult> {
    const { backoff, files, limits } = this.#o;
    const now = ctx.clock.now();
    // The one fact the plan cannot settle alone: the order budget is shared by every domain,
    // and the attempts of this same pass spend it while the plan's actions are applied.
    const data = await backoff.load();
    const budget = orderHold(data.orders, now, limits);
    if (budget !== null && budget > now) {
      this.#report(ctx, domainInfo(domain, await files.served(domain, now), data.domains[domain], false));
      return { requeueAfterMs: budget - now };
    }
    // A name that does not resolve can't pass HTTP-01: spend no attempt, look again soon.
    const error = await this.#dnsProblem(domain);
    if (error !== null) {
      // Written once at the end of the pass (afterActions), with every other domain's.
      await backoff.change((d) => {
        d.domains[domain] = recordDnsNotReady(d.domains[domain], { at: now, error, acmeKey });
      }, now);
      this.#report(ctx, domainInfo(domain, await files.served(domain, ctx.clock.now()), await backoff.get(domain), false));
      return { requeueAfterMs: DNS_RETRY_MS };
    }
    return this.#runCertbot(domain, renew, acme, acmeKey, ctx);
  }

  /** Why `domain` cannot pass HTTP-01 now (it does not resolve), or null. */
  async #dnsProblem(domain: string): Promise<string | null> {
    if (this.#o.resolve === null) return null;
    try {
      await this.#o.resolve(domain);
      return null;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      return `${domain} does not resolve${code ? ` (${code})` : ''}; point its DNS at the gateway`;
    }
  }

  /**
   * One certbot run, one at a time; the attempt counts from here on, whatever its outcome.
   * --force-renewal always: whether a certificate is due is decided by the plan, not certbot.
   * What counts is a valid certificate on disk (a new one when renewing), not the exit code.
   */
  async #runCertbot(domain: string, renew: boolean, acme: AcmeSettings, acmeKey: string, ctx: LoopContext): Promise<ApplyResult> {
    const { backoff, files, certbot, limits } = this.#o;
    const start = ctx.clock.now();
    const before = await files.served(domain, start);
    await backoff.update((d) => d.orders.push(start), start);
    this.#report(ctx, domainInfo(domain, before, await backoff.get(domain), true));
    const result = await certbot.run(
      {
        domain,
        acme,
        webroot: this.#o.acmeWebroot,
        dirs: this.#o.certbotDirs,
        force: true,
        ...(this.#o.sharedChallenges ? { sharedChallenges: this.#o.sharedChallenges } : {}),
      },
      ctx.clock,
    );
    const now = ctx.clock.now();
    if (!result.ok && CERTBOT_BUSY.test(result.error)) {
      // Another certbot holds these directories (the gateway this one takes over from, in the
      // middle of an order): this run reached no CA, so nothing counts against the domain or the
      // order budget; ask again shortly.
      await backoff.update((d) => {
        const i = d.orders.lastIndexOf(start);
        if (i >= 0) d.orders.splice(i, 1);
      }, now);
      ctx.logger.info({ domain }, `another certbot is running on this gateway's certbot directories; trying ${domain} again shortly`);
      this.#report(ctx, domainInfo(domain, await files.served(domain, now), await backoff.get(domain), true));
      return { requeueAfterMs: CERTBOT_BUSY_RETRY_MS };
    }
    const c = await files.lineage(domain, now);
    const fresh = c.ok && !(renew && before?.ok && before.info.serial === c.info.serial);
    if (result.ok && fresh) {
      await this.#o.onIssued?.(domain, { info: c.info, certPem: c.certPem!, keyPem: c.keyPem! }, acmeKey);
      await files.publish(domain, c.info.serial, c.certPem!, c.keyPem!);
      await backoff.update((d) => {
        const prev = d.domains[domain]?.attempts ?? [];
        d.domains[domain] = { failedAttempts: 0, attempts: [...prev.filter((t) => t > now - DOMAIN_WINDOW_MS), start] };
      }, now);
      ctx.logger.info({ domain, serial: c.info.serial, durationMs: result.durationMs }, `certificate for ${domain} issued`);
      this.#report(ctx, domainInfo(domain, c, await backoff.get(domain), false));
      return requeueUntil(c.info.renewalTime, now);
    }
    const error = result.ok
      ? `certbot succeeded but left no new usable certificate: ${c.ok ? `serial ${c.info.serial} unchanged` : c.message}`
      : result.error;
    await backoff.update((d) => {
      d.domains[domain] = recordFailure(d.domains[domain], { at: start, finishedAt: now, error, acmeKey }, limits);
    }, now);
    const entry = await backoff.get(domain);
    ctx.logger.warn(
      { domain, error, failedAttempts: entry?.failedAttempts, nextAttemptTime: entry?.nextAttemptTime },
      `certificate for ${domain} not issued`,
    );
    this.#report(ctx, domainInfo(domain, await files.served(domain, now), entry, false));
    const retry = nextAllowed(entry, (await backoff.load()).orders, acmeKey, now, limits);
    return { requeueAfterMs: Math.max(1_000, retry.at - now) };
  }

  #report(ctx: LoopContext, info: ReturnType<typeof domainInfo>): void {
    reportDomain(ctx.status, info, this.#o.files.certsDir);
  }
}
