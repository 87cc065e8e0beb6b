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
import { chmod, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ProxyState } from '../../spec/types.js';
import type { Action, ApplyResult, Loop, LoopContext, LoopHandle, MetricFamily, StatusWriter } from '../types.js';
import {
  BackoffStore,
  DEFAULT_LIMITS,
  DOMAIN_WINDOW_MS,
  DNS_RETRY_MS,
  nextAllowed,
  orderHold,
  recordDnsNotReady,
  recordFailure,
  type BackoffFile,
  type Limits,
} from './backoff.js';
import { CertbotRunner, secret, type AcmeSettings, type CertbotDirs } from './certbot.js';
import { readCertificate, type CertCheck } from './certificate.js';
import { certificateMetricFamilies } from './metrics.js';
import { actionFor, domainInput } from './plan.js';
import { TLS_LOOP, certificateOutputsOf, domainConditions, domainInfo, publishedPaths, type DomainInfo } from './status.js';

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

const MAX_REQUEUE_MS = 24 * 60 * 60_000; // 24 h: the resync covers anything later

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
  const certsDir = o.certsDir ?? join(o.stateDir, 'tls-certs');
  const limits: Limits = { ...DEFAULT_LIMITS, ...o.limits };
  const dnsPreflight = o.dnsPreflight ?? true;
  const resolveName = o.resolve ?? ((d: string) => lookup(d));
  const certbot = new CertbotRunner({
    ...(o.certbotBin ? { certbotBin: o.certbotBin } : {}),
    ...(o.timeoutMs ? { timeoutMs: o.timeoutMs } : {}),
    ...(o.env ? { env: o.env } : {}),
  });
  const backoff = new BackoffStore(join(o.stateDir, 'tls-backoff.json'));
  /** The live status, for the metric families (read between passes). */
  let live: StatusWriter | null = null;

  const lineagePaths = (domain: string) => ({
    cert: join(dirs.configDir, 'live', domain, 'fullchain.pem'),
    key: join(dirs.configDir, 'live', domain, 'privkey.pem'),
  });

  // Outputs first: a reader never sees Ready=True next to the outputs of an older state.
  const report = (ctx: LoopContext, info: DomainInfo): void => {
    ctx.status.setOutputs(info.domain, certificateOutputsOf(info, certsDir));
    const { ready, issuing } = domainConditions(info);
    ctx.status.set(info.domain, ready);
    ctx.status.set(info.domain, issuing);
  };

  /** The lineage's certificate when it is valid and published (what Nginx serves), else null. */
  const served = async (domain: string, now: number): Promise<CertCheck | null> => {
    const p = lineagePaths(domain);
    const c = await readCertificate(p.cert, p.key, domain, now);
    return c.ok && (await exists(publishedPaths(certsDir, domain, c.info.serial).certPath)) ? c : null;
  };

  const publish = async (domain: string, serial: string, certPem: string, keyPem: string): Promise<void> => {
    const target = join(certsDir, domain, serial);
    if (await exists(target)) return;
    await mkdir(join(certsDir, domain), { recursive: true, mode: 0o700 });
    const tmp = `${target}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { mode: 0o700 });
    await writeFile(join(tmp, 'fullchain.pem'), certPem, { mode: 0o644 });
    await writeFile(join(tmp, 'privkey.pem'), keyPem, { mode: 0o600 });
    await chmod(join(tmp, 'privkey.pem'), 0o600);
    await rename(tmp, target);
    // Keep the current and the previous copy (Nginx may serve the previous until its reload).
    const entries = await readdir(join(certsDir, domain));
    const dated = await Promise.all(
      entries.filter((e) => !e.includes('.tmp-')).map(async (e) => ({ e, t: (await stat(join(certsDir, domain, e))).mtimeMs })),
    );
    dated.sort((a, b) => b.t - a.t);
    for (const { e } of dated.slice(2)) if (e !== serial) await rm(join(certsDir, domain, e), { recursive: true, force: true });
  };

  /** Why `domain` cannot pass HTTP-01 now (it does not resolve), or null. */
  const dnsProblem = async (domain: string): Promise<string | null> => {
    if (!dnsPreflight) return null;
    try {
      await resolveName(domain);
      return null;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      return `${domain} does not resolve${code ? ` (${code})` : ''}; point its DNS at the gateway`;
    }
  };

  /** An issue or renew action: the DNS pre-flight, then one certbot run. */
  const attempt = async (domain: string, renew: boolean, acme: AcmeSettings, acmeKey: string, ctx: LoopContext): Promise<ApplyResult> => {
    const now = ctx.clock.now();
    // The one fact the plan cannot settle alone: the order budget is shared by every domain,
    // and the attempts of this same pass spend it while the plan's actions are applied.
    const data = await backoff.load();
    const budget = orderHold(data.orders, now, limits);
    if (budget !== null && budget > now) {
      report(ctx, domainInfo(domain, await served(domain, now), data.domains[domain], false));
      return { requeueAfterMs: budget - now };
    }
    // A name that does not resolve can't pass HTTP-01: spend no attempt, look again soon.
    const error = await dnsProblem(domain);
    if (error !== null) {
      // Written once at the end of the pass (afterActions), with every other domain's.
      await backoff.change((d) => {
        d.domains[domain] = recordDnsNotReady(d.domains[domain], { at: now, error, acmeKey });
      }, now);
      report(ctx, domainInfo(domain, await served(domain, ctx.clock.now()), await backoff.get(domain), false));
      return { requeueAfterMs: DNS_RETRY_MS };
    }
    return runCertbot(domain, renew, acme, acmeKey, ctx);
  };

  /**
   * One certbot run, one at a time; the attempt counts from here on, whatever its outcome.
   * --force-renewal always: whether a certificate is due is decided by the plan, not certbot.
   * What counts is a valid certificate on disk (a new one when renewing), not the exit code.
   */
  const runCertbot = async (
    domain: string,
    renew: boolean,
    acme: AcmeSettings,
    acmeKey: string,
    ctx: LoopContext,
  ): Promise<ApplyResult> => {
    const start = ctx.clock.now();
    const before = await served(domain, start);
    await backoff.update((d) => d.orders.push(start), start);
    report(ctx, domainInfo(domain, before, await backoff.get(domain), true));
    const result = await certbot.run({ domain, acme, webroot: o.acmeWebroot, dirs, force: true });
    const now = ctx.clock.now();
    const p = lineagePaths(domain);
    const c = await readCertificate(p.cert, p.key, domain, now);
    const fresh = c.ok && !(renew && before?.ok && before.info.serial === c.info.serial);
    if (result.ok && fresh) {
      await publish(domain, c.info.serial, c.certPem!, c.keyPem!);
      await backoff.update((d) => {
        const prev = d.domains[domain]?.attempts ?? [];
        d.domains[domain] = { failedAttempts: 0, attempts: [...prev.filter((t) => t > now - DOMAIN_WINDOW_MS), start] };
      }, now);
      ctx.logger.info({ domain, serial: c.info.serial, durationMs: result.durationMs }, `certificate for ${domain} issued`);
      report(ctx, domainInfo(domain, c, await backoff.get(domain), false));
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
    report(ctx, domainInfo(domain, await served(domain, now), entry, false));
    const retry = nextAllowed(entry, (await backoff.load()).orders, acmeKey, now, limits);
    return { requeueAfterMs: Math.max(1_000, retry.at - now) };
  };

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
      const data = await backoff.load();
      const lineages = new Map<string, CertCheck>();
      for (const domain of await listDirs(join(dirs.configDir, 'live'))) {
        const p = lineagePaths(domain);
        const { certPem: _c, keyPem: _k, ...check } = await readCertificate(p.cert, p.key, domain, now);
        lineages.set(domain, check);
      }
      const published = new Map<string, Set<string>>();
      for (const domain of await listDirs(certsDir)) {
        published.set(domain, new Set((await listDirs(join(certsDir, domain))).filter((s) => !s.includes('.tmp-'))));
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
          await rm(join(certsDir, domain), { recursive: true, force: true });
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
          const p = lineagePaths(domain);
          const c = await readCertificate(p.cert, p.key, domain, ctx.clock.now());
          if (!c.ok) throw new Error(`the certificate for ${domain} is no longer usable: ${c.message}`);
          await publish(domain, c.info.serial, c.certPem!, c.keyPem!);
          report(ctx, domainInfo(domain, c, await backoff.get(domain), false));
          return requeueUntil(c.info.renewalTime, ctx.clock.now());
        }
        case 'wait': {
          // Nothing to do but come back when the hold ends; say where the domain stands
          // (a domain back in the document after a removal is not tracked by observe yet).
          const now = ctx.clock.now();
          report(ctx, domainInfo(domain, await served(domain, now), await backoff.get(domain), false));
          return { requeueAfterMs: Math.max(0, action.payload.until! - now) };
        }
        default:
          return attempt(domain, action.kind === 'renew', action.payload.acme!, action.payload.acmeKey!, ctx);
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

function requeueUntil(renewalTime: number, now: number): ApplyResult {
  return { requeueAfterMs: Math.min(MAX_REQUEUE_MS, Math.max(1_000, renewalTime - now)) };
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
