// The TLS loop: a certificate per `https: true` domain from the document's ACME server.
//
// desired  = the https domains and the ACME settings (pure)
// observe  = certbot's lineages, the published copies, the persisted backoff; writes each
//            tracked domain's Ready/Issuing conditions
// plan     = issue (no valid certificate) | renew (2/3 of the lifetime passed) | publish (a
//            valid lineage not yet copied where Nginx reads it) | delete (the domain left) (pure)
// apply    = 1. backoff and rate limits → 2. DNS pre-flight → 3. certbot → 4. check the files
//            → 5. publish and report. A failure is recorded in the backoff file and the action
//            comes back when the schedule allows (requeueAfterMs), never sooner.

import { createHash } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import { chmod, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ProxyState } from '../../spec/types.js';
import type { Action, ApplyResult, Loop, LoopContext } from '../types.js';
import {
  BackoffStore,
  DEFAULT_LIMITS,
  DOMAIN_WINDOW_MS,
  DNS_RETRY_MS,
  attemptsInNextHour,
  nextAllowed,
  recordDnsNotReady,
  recordFailure,
  type BackoffFile,
  type Limits,
} from './backoff.js';
import { CertbotRunner, secret, type AcmeSettings, type CertbotDirs } from './certbot.js';
import { needsIssuing, readCertificate, type CertCheck } from './certificate.js';
import { TLS_LOOP, domainConditions, domainInfo, publishedPaths, type DomainInfo } from './status.js';

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
  acme?: AcmeSettings;
  acmeKey?: string;
}

export type TlsLoop = Loop<TlsDesired, TlsObserved, TlsPayload> & {
  /** The figures of one domain as last seen (serial, notAfter, renewalTime, failures …). */
  domainInfo(domain: string): DomainInfo | undefined;
  /** Where published certificates live (for certForFromStatus). */
  readonly certsDir: string;
  /** certbot runs so far. */
  certbotRuns(): number;
  /** Writes of tls-backoff.json so far. */
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
  const infos = new Map<string, DomainInfo>();

  const lineagePaths = (domain: string) => ({
    cert: join(dirs.configDir, 'live', domain, 'fullchain.pem'),
    key: join(dirs.configDir, 'live', domain, 'privkey.pem'),
  });

  const report = (ctx: LoopContext, info: DomainInfo): void => {
    infos.set(info.domain, info);
    const { ready, issuing } = domainConditions(info);
    ctx.status.set(info.domain, ready);
    ctx.status.set(info.domain, issuing);
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

  const loop: TlsLoop = {
    name: TLS_LOOP,
    certsDir,
    certbotRuns: () => certbot.runs,
    backoffWrites: () => backoff.writes,
    // Nginx reads only what this loop has observed (the certificates on disk): it never waits
    // for a DNS check or a certbot run, and each certificate obtained later triggers it anew.
    settlesAfter: 'plan',
    // DNS checks use getaddrinfo on libuv's small thread pool, which file I/O shares: two at
    // a time leave room for the other loops when the resolver is slow.
    concurrency: 2,
    domainInfo: (domain) => {
      const i = infos.get(domain);
      return i ? structuredClone(i) : undefined;
    },

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
      const { now } = observed;
      const actions: Action<TlsPayload>[] = [];
      const want = new Set(desired.domains);
      for (const domain of desired.domains) {
        const check = observed.lineages.get(domain) ?? { ok: false as const, reason: 'Missing' as const, message: 'no certificate yet' };
        const need = needsIssuing(check, now);
        if (need) {
          const entry = observed.backoff.domains[domain];
          const next = nextAllowed(entry, observed.backoff.orders, desired.acmeKey, now, limits);
          const allowed = attemptsInNextHour(entry, desired.acmeKey, now, limits);
          const when = next.at > now ? `next attempt at ${new Date(next.at).toISOString()}` : 'now';
          const kind = check.ok ? 'renew' : 'issue';
          actions.push({
            key: domain,
            kind,
            summary: `${kind === 'renew' ? 'renew the certificate' : 'request a certificate'} for ${domain} from ${desired.acme.server} (${need.message}); ${when}; backoff allows ${allowed} attempt(s) in the next hour`,
            payload: { domain, acme: desired.acme, acmeKey: desired.acmeKey },
          });
          continue;
        }
        if (check.ok && !observed.published.get(domain)?.has(check.info.serial)) {
          actions.push({ key: domain, kind: 'publish', summary: `serve the existing certificate for ${domain} (serial ${check.info.serial})`, payload: { domain } });
        }
      }
      for (const domain of trackedDomains(observed.published, observed.backoff)) {
        if (!want.has(domain)) actions.push({ key: domain, kind: 'delete', summary: `stop serving the certificate for ${domain}`, payload: { domain } });
      }
      return actions;
    },

    async afterActions(): Promise<void> {
      await backoff.flush();
    },

    async apply(action: Action<TlsPayload>, ctx: LoopContext): Promise<ApplyResult> {
      const { domain } = action.payload;
      if (action.kind === 'delete') {
        await rm(join(certsDir, domain), { recursive: true, force: true });
        const now = ctx.clock.now();
        await backoff.change((d) => {
          const e = d.domains[domain];
          if (!e) return;
          if (e.attempts.some((t) => t > now - DOMAIN_WINDOW_MS)) e.removed = true; // its attempts still count
          else delete d.domains[domain];
        }, now);
        ctx.status.delete(domain);
        infos.delete(domain);
        return 'done';
      }
      if (action.kind === 'publish') {
        const p = lineagePaths(domain);
        const c = await readCertificate(p.cert, p.key, domain, ctx.clock.now());
        if (!c.ok) throw new Error(`the certificate for ${domain} is no longer usable: ${c.message}`);
        await publish(domain, c.info.serial, c.certPem!, c.keyPem!);
        report(ctx, domainInfo(domain, c, await backoff.get(domain), false));
        return requeueUntil(c.info.renewalTime, ctx.clock.now());
      }
      return issue(domain, action.kind === 'renew', action.payload.acme!, action.payload.acmeKey!, ctx);
    },
  };

  async function issue(domain: string, renew: boolean, acme: AcmeSettings, acmeKey: string, ctx: LoopContext): Promise<ApplyResult> {
    const p = lineagePaths(domain);
    const current = async (): Promise<CertCheck | null> => {
      const c = await readCertificate(p.cert, p.key, domain, ctx.clock.now());
      return c.ok && (await exists(publishedPaths(certsDir, domain, c.info.serial).certPath)) ? c : null;
    };
    // 1. Backoff and rate limits: not before the schedule allows.
    let now = ctx.clock.now();
    const data = await backoff.load();
    const next = nextAllowed(data.domains[domain], data.orders, acmeKey, now, limits);
    if (next.at > now) {
      report(ctx, domainInfo(domain, await current(), data.domains[domain], false));
      return { requeueAfterMs: next.at - now };
    }
    // 2. DNS pre-flight: a name that does not resolve can't pass HTTP-01; spend no attempt.
    if (dnsPreflight) {
      try {
        await resolveName(domain);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        const error = `${domain} does not resolve${code ? ` (${code})` : ''}; point its DNS at the gateway`;
        // Written once at the end of the pass (afterActions), with every other domain's.
        await backoff.change((d) => {
          d.domains[domain] = recordDnsNotReady(d.domains[domain], { at: now, error, acmeKey });
        }, now);
        report(ctx, domainInfo(domain, await current(), await backoff.get(domain), false));
        return { requeueAfterMs: DNS_RETRY_MS };
      }
    }
    // 3. certbot, one at a time (the attempt counts from here on, whatever its outcome).
    //    --force-renewal always: whether a certificate is due is decided here, not by certbot.
    const start = now;
    const before = await current();
    await backoff.update((d) => d.orders.push(start), start);
    report(ctx, domainInfo(domain, before, data.domains[domain], true));
    const result = await certbot.run({ domain, acme, webroot: o.acmeWebroot, dirs, force: true });
    // 4. What counts is a valid certificate on disk (a new one when renewing), not the exit code.
    now = ctx.clock.now();
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
    const error = result.ok ? `certbot succeeded but left no new usable certificate: ${c.ok ? `serial ${c.info.serial} unchanged` : c.message}` : result.error;
    await backoff.update((d) => {
      d.domains[domain] = recordFailure(d.domains[domain], { at: start, finishedAt: now, error, acmeKey }, limits);
    }, now);
    const entry = await backoff.get(domain);
    ctx.logger.warn({ domain, error, failedAttempts: entry?.failedAttempts, nextAttemptTime: entry?.nextAttemptTime }, `certificate for ${domain} not issued`);
    report(ctx, domainInfo(domain, await current(), entry, false));
    const retry = nextAllowed(entry, (await backoff.load()).orders, acmeKey, now, limits);
    return { requeueAfterMs: Math.max(1_000, retry.at - now) };
  }

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
    return (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name).sort();
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
