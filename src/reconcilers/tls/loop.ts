// The TLS loop: a certificate per `https: true` domain from the document's ACME server.
//
// desired  = the https domains and the ACME settings (pure)
// observe  = gathers what decides each domain: certbot's lineages, the published copies, the
//            persisted backoff; reports each tracked domain (conditions for people, typed
//            CertificateOutputs for Nginx, metrics and the CLI)
// plan     = per domain, the pure policies of policies.ts: issue (no valid certificate) | renew
//            (2/3 of the lifetime passed) | wait (a backoff, DNS re-check or rate limit holds it:
//            the action only comes back at the end of the hold) | publish (a valid lineage not
//            yet copied where Nginx reads it); delete for a domain that left (pure)
// apply    = issue/renew: DNS pre-flight → certbot → check the files → publish and report. A
//            failure is recorded in the backoff file, and the action comes back when the
//            schedule allows (requeueAfterMs), never sooner.

import { createHash } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import { join } from 'node:path';
import type { ProxyState } from '../../spec/types.js';
import type { Action, ApplyResult, Loop, LoopContext, LoopHandle, MetricFamily, StatusWriter } from '../types.js';
import {
  BackoffStore,
  DEFAULT_LIMITS,
  DOMAIN_WINDOW_MS,
  SharedBackoffStore,
  type Backoff,
  type BackoffFile,
  type Limits,
} from './backoff.js';
import { CertbotRunner, secret, type AcmeSettings, type CertbotDirs } from './certbot.js';
import type { CertCheck } from './certificate.js';
import { CertFiles } from './cert-files.js';
import { fleetAttempt, fleetLineages, issuerName, storedPair, type CheckedSerials } from './fleet.js';
import { Issuer, requeueUntil } from './issuer.js';
import { certificateMetricFamilies } from './metrics.js';
import { actionFor, domainInput } from './plan.js';
import type { SharedCertificates } from './shared.js';
import { TLS_LOOP, domainInfo, reportDomain, type DomainInfo } from './status.js';

export interface TlsLoopOptions {
  /** The gateway's state dir: tls-backoff.json, certbot/ and tls-certs/ go here. */
  stateDir: string;
  /** The webroot Nginx serves /.well-known/acme-challenge/ from. */
  acmeWebroot: string;
  /** certbot's dirs; default <stateDir>/certbot/{config,work,logs} (private mode). */
  certbotDirs?: Partial<CertbotDirs>;
  /** Where validated certificates are published for Nginx; default <stateDir>/tls-certs. */
  certsDir?: string;
  /** Default 'certbot'. */
  certbotBin?: string;
  /** certbot timeout; default 40_000 (40 s). */
  timeoutMs?: number;
  /** Extra environment for certbot (REQUESTS_CA_BUNDLE in tests). */
  env?: Record<string, string>;
  /** Check that the domain resolves before spending an ACME attempt. Default true. */
  dnsPreflight?: boolean;
  /** Resolves a name or throws. Default: node:dns lookup (A/AAAA). */
  resolve?: (domain: string) => Promise<unknown>;
  /** Backoff schedule and rate limits; defaults in backoff.ts. */
  limits?: Partial<Limits>;
  /**
   * A fleet's shared certificates: one gateway orders each domain's certificate, the others
   * install it from the store; key authorizations, the account and the backoff are the fleet's.
   */
  shared?: SharedCertificates;
}

export interface TlsDesired {
  acme: AcmeSettings;
  /** Fingerprint of server + EAB (the HMAC key only hashed). */
  acmeKey: string;
  domains: string[];
}

export interface TlsObserved {
  now: number;
  lineages: Map<string, CertCheck>;
  /** Domain → serials with a published copy. */
  published: Map<string, Set<string>>;
  backoff: BackoffFile;
}

export interface TlsPayload {
  domain: string;
  /** issue / renew: the settings to request it with. */
  acme?: AcmeSettings;
  acmeKey?: string;
  /** wait: the end of the hold (epoch ms). */
  until?: number;
}

export type TlsLoop = Loop<TlsDesired, TlsObserved, TlsPayload> & {
  /** Keeps the live status: the metric families read it between passes. */
  start(handle: LoopHandle): void;
  /** The certificate families, over the outputs in the loop's status (empty before start). */
  metrics(): MetricFamily[];
  /** certbot runs so far (for tests: an attempt is spent exactly when this grows). */
  certbotRuns(): number;
  /** Writes of tls-backoff.json so far (for tests: a pass writes it at most once). */
  backoffWrites(): number;
};

export function acmeKeyOf(acme: ProxyState['spec']['acme']): string {
  const h = createHash('sha256');
  h.update(`${acme.server}\n${acme.eabKid ?? ''}\n`);
  if (acme.eabHmacKey) h.update(createHash('sha256').update(acme.eabHmacKey).digest('hex'));
  return h.digest('hex').slice(0, 16);
}

/** The https domains of a document, sorted (pure). */
export function httpsDomains(state: ProxyState): string[] {
  const out = new Set<string>();
  for (const s of state.spec.services) if (s.https && s.domain) out.add(s.domain);
  for (const e of state.spec.entrypoints) if (e.https) out.add(e.domain);
  return [...out].sort();
}

export function createTlsLoop(o: TlsLoopOptions): TlsLoop {
  if (!o.stateDir) throw new TypeError('stateDir is required');
  if (!o.acmeWebroot) throw new TypeError('acmeWebroot is required');
  const certbotRoot = join(o.stateDir, 'certbot');
  const dirs: CertbotDirs = {
    configDir: o.certbotDirs?.configDir ?? join(certbotRoot, 'config'),
    workDir: o.certbotDirs?.workDir ?? join(certbotRoot, 'work'),
    logsDir: o.certbotDirs?.logsDir ?? join(certbotRoot, 'logs'),
  };
  const shared = o.shared;
  const files = new CertFiles(dirs.configDir, o.certsDir ?? join(o.stateDir, 'tls-certs'), shared !== undefined);
  const limits: Limits = { ...DEFAULT_LIMITS, ...o.limits };
  const certbot = new CertbotRunner({
    ...(o.certbotBin ? { certbotBin: o.certbotBin } : {}),
    ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}),
    ...(o.env ? { env: o.env } : {}),
  });
  const backoff: Backoff = shared ? new SharedBackoffStore(shared.backoff) : new BackoffStore(join(o.stateDir, 'tls-backoff.json'));
  const issuer = new Issuer({
    files,
    backoff,
    certbot,
    certbotDirs: dirs,
    acmeWebroot: o.acmeWebroot,
    limits,
    resolve: (o.dnsPreflight ?? true) ? (o.resolve ?? ((d: string) => lookup(d))) : null,
    ...(shared
      ? {
          sharedChallenges: { env: shared.hookEnv() },
          // Stored before it is served here: a gateway that dies next has not ordered in vain.
          onIssued: (domain, c, acmeKey) => shared.put({ domain, ...c.info, certPem: c.certPem, keyPem: c.keyPem, acmeKey }, issuerName()),
        }
      : {}),
  });
  let lastBackoff: BackoffFile = { version: 1, domains: {}, orders: [] };
  /** A fleet's stored certificates whose PEMs were read: a pass reads only new serials. */
  const checkedSerials: CheckedSerials = new Map();
  /** The live status, for the metric families (read between passes). */
  let live: StatusWriter | null = null;
  const report = (ctx: LoopContext, info: DomainInfo): void => reportDomain(ctx.status, info, files.certsDir);

  const loop: TlsLoop = {
    name: TLS_LOOP,
    certbotRuns: () => certbot.runs,
    backoffWrites: () => backoff.writes,
    // Nginx reads only what this loop has observed (the certificates on disk): it never waits
    // for a DNS check or a certbot run, and each certificate obtained later triggers it anew.
    settlesAfter: 'plan',
    // DNS checks use getaddrinfo on libuv's small thread pool, which file I/O shares: two at
    // a time leave room for the other loops when the resolver is slow.
    concurrency: 2,

    start(handle) {
      live = handle.status;
      // A certificate another gateway stored: installed at once, not at the next resync.
      shared?.onChange(() => handle.trigger());
    },

    metrics: () => certificateMetricFamilies(() => live),

    desired(spec: ProxyState): TlsDesired {
      const a = spec.spec.acme;
      const acme: AcmeSettings = { server: a.server };
      if (a.email) acme.email = a.email;
      if (a.eabKid && a.eabHmacKey) acme.eab = { kid: a.eabKid, hmacKey: secret(a.eabHmacKey) };
      return { acme, acmeKey: acmeKeyOf(a), domains: httpsDomains(spec) };
    },

    async observe(ctx: LoopContext): Promise<TlsObserved> {
      const now = ctx.clock.now();
      // A fleet's store that does not answer leaves the backoff last read: the domains are
      // still reported, and nothing is ordered (the lock does not answer either).
      const data = shared
        ? await backoff.load().then(
            (d) => (lastBackoff = d),
            () => lastBackoff,
          )
        : await backoff.load();
      const published = await files.published();
      let lineages = new Map<string, CertCheck>();
      if (shared) lineages = await fleetLineages(shared, files, published, checkedSerials, now, ctx.logger);
      else
        for (const domain of await files.lineageDomains()) {
          const { certPem: _c, keyPem: _k, ...check } = await files.lineage(domain, now);
          lineages.set(domain, check);
        }
      // Tracked domains: published, or with a live backoff entry. Report each from the facts.
      const tracked = trackedDomains(published, data);
      ctx.status.prune(tracked);
      for (const domain of tracked) {
        const check = lineages.get(domain) ?? null;
        const servable = check?.ok && published.get(domain)?.has(check.info.serial) ? check : null;
        report(ctx, domainInfo(domain, servable ?? (check && !check.ok ? check : null), data.domains[domain], false));
      }
      return { now, lineages, published, backoff: structuredClone(data) };
    },

    plan(desired: TlsDesired, observed: TlsObserved): Action<TlsPayload>[] {
      const actions: Action<TlsPayload>[] = [];
      for (const domain of desired.domains) {
        const action = actionFor(domainInput(domain, desired, observed, limits), desired, limits);
        if (action) actions.push(action);
      }
      const want = new Set(desired.domains);
      for (const domain of trackedDomains(observed.published, observed.backoff)) {
        if (!want.has(domain))
          actions.push({ key: domain, kind: 'delete', summary: `stop serving the certificate for ${domain}`, payload: { domain } });
      }
      return actions;
    },

    async afterActions(): Promise<void> {
      await backoff.flush();
    },

    async apply(action: Action<TlsPayload>, ctx: LoopContext): Promise<ApplyResult> {
      const { domain } = action.payload;
      switch (action.kind) {
        case 'delete': {
          await files.unpublish(domain);
          const now = ctx.clock.now();
          await backoff.change((d) => {
            const e = d.domains[domain];
            if (!e) return;
            if (e.attempts.some((t) => t > now - DOMAIN_WINDOW_MS))
              e.removed = true; // its attempts still count
            else delete d.domains[domain];
          }, now);
          ctx.status.delete(domain);
          return 'done';
        }
        case 'publish': {
          const now = ctx.clock.now();
          const c = shared ? await storedPair(shared, domain, now) : await files.lineage(domain, now);
          const check = 'check' in c ? c.check : c;
          if (!check.ok) throw new Error(`the certificate for ${domain} is no longer usable: ${check.message}`);
          await files.publish(domain, check.info.serial, c.certPem!, c.keyPem!);
          report(ctx, domainInfo(domain, check, await backoff.get(domain), false));
          return requeueUntil(check.info.renewalTime, ctx.clock.now());
        }
        case 'wait': {
          // Nothing to do but come back when the hold ends; say where the domain stands
          // (a domain back in the document after a removal is not tracked by observe yet).
          const now = ctx.clock.now();
          report(ctx, domainInfo(domain, await files.served(domain, now), await backoff.get(domain), false));
          return { requeueAfterMs: Math.max(0, action.payload.until! - now) };
        }
        default: {
          const renew = action.kind === 'renew';
          const { acme, acmeKey } = action.payload as Required<TlsPayload>;
          if (!shared) return issuer.attempt(domain, renew, acme, acmeKey, ctx);
          const fleetReport = async (c: LoopContext, check: CertCheck | null, issuing: boolean): Promise<void> =>
            report(c, domainInfo(domain, check, await backoff.get(domain), issuing));
          return fleetAttempt({ shared, files, issuer, configDir: dirs.configDir, report: fleetReport }, domain, renew, acme, acmeKey, ctx);
        }
      }
    },
  };

  return loop;
}

function trackedDomains(published: Map<string, Set<string>>, data: BackoffFile): string[] {
  const out = new Set(published.keys());
  for (const [d, e] of Object.entries(data.domains)) if (!e.removed) out.add(d);
  return [...out].sort();
}
