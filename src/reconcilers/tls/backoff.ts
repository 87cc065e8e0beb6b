// Per-domain ACME backoff, persisted in <stateDir>/tls-backoff.json (0600, atomic write) so a
// restart continues the schedule instead of resetting it.
//
// Schedule: after the n-th consecutive failed attempt for a domain the next attempt waits
//   1 min, 5 min, 15 min, 30 min, 1 h, 2 h, 4 h, 8 h, 16 h, then 24 h for every further failure.
// It starts short (a first failure is usually DNS not yet pointing at the gateway) and grows.
// Two hard limits hold on top of it, whatever the schedule or a changed document says:
//   - at most 5 ACME attempts per domain in any sliding hour (Let's Encrypt: ≤ 5 failed
//     authorizations per hostname per hour; every attempt counts, failed or not);
//   - at most 300 ACME attempts (each is at most one new order) in any sliding 3 h, for all
//     domains together (Let's Encrypt: ≤ 300 new orders per account per 3 h).
// With the schedule alone, consecutive attempts start at 0, 1, 6, 21, 51, 111 min: never more
// than 5 in an hour. A changed ACME server or EAB key for the domain may retry at once (the
// failures were against other settings), still within the hourly limit.

import { readFile } from 'node:fs/promises';
import { writeAtomic } from '../../write-atomic.js';
import { backoffFrom, type SharedBackoffData } from './shared.js';

const MIN = 60_000;
const HOUR = 60 * MIN;

/** Delay after the n-th consecutive failure (index n-1); the last repeats. */
export const TLS_BACKOFF_SCHEDULE_MS: readonly number[] = [
  1 * MIN,
  5 * MIN,
  15 * MIN,
  30 * MIN,
  1 * HOUR,
  2 * HOUR,
  4 * HOUR,
  8 * HOUR,
  16 * HOUR,
  24 * HOUR,
];
export const MAX_ATTEMPTS_PER_DOMAIN_PER_HOUR = 5;
export const MAX_ORDERS_PER_3H = 300;
export const ORDER_WINDOW_MS = 3 * HOUR;
export const DOMAIN_WINDOW_MS = HOUR;
/** When the domain does not resolve: check DNS again after this, without spending an attempt. */
export const DNS_RETRY_MS = 30_000; // 30 s

export interface DomainBackoff {
  failedAttempts: number;
  lastFailureTime?: number;
  /** No ACME attempt before this (epoch ms). */
  nextAttemptTime?: number;
  /** One line, scrubbed. */
  lastError?: string;
  lastReason?: 'IssueFailed' | 'DNSNotReady';
  /** Fingerprint of the ACME settings the failures were against (no secret in it). */
  acmeKey?: string;
  /** Start times of ACME attempts in the last hour. */
  attempts: number[];
  /** The domain left the document; kept only while its attempts still count. */
  removed?: boolean;
}

export interface BackoffFile {
  version: 1;
  domains: Record<string, DomainBackoff>;
  /** Start times of ACME attempts (all domains) in the last 3 h. */
  orders: number[];
}

export interface Limits {
  schedule: readonly number[];
  maxPerDomainPerHour: number;
  maxOrdersPer3h: number;
}

export const DEFAULT_LIMITS: Limits = {
  schedule: TLS_BACKOFF_SCHEDULE_MS,
  maxPerDomainPerHour: MAX_ATTEMPTS_PER_DOMAIN_PER_HOUR,
  maxOrdersPer3h: MAX_ORDERS_PER_3H,
};

export function delayAfter(failures: number, schedule: readonly number[] = TLS_BACKOFF_SCHEDULE_MS): number {
  const i = Math.min(Math.max(1, failures), schedule.length) - 1;
  return schedule[i] ?? 24 * HOUR;
}

/**
 * The failure schedule's hold (pure): no attempt before the entry's nextAttemptTime. A schedule
 * built against other ACME settings does not hold (the failures were against those), except a
 * DNS re-check: the name does not resolve whatever the server.
 */
export function scheduleHold(entry: DomainBackoff | undefined, acmeKey: string): number | null {
  if (entry?.nextAttemptTime === undefined) return null;
  const sameSettings = entry.acmeKey === undefined || entry.acmeKey === acmeKey;
  return sameSettings || entry.lastReason === 'DNSNotReady' ? entry.nextAttemptTime : null;
}

/** The per-domain hourly limit's hold (pure): when the oldest attempt of a full window leaves it. */
export function hourlyHold(entry: DomainBackoff | undefined, now: number, limits: Limits = DEFAULT_LIMITS): number | null {
  const recent = (entry?.attempts ?? []).filter((t) => t > now - DOMAIN_WINDOW_MS).sort((a, b) => a - b);
  return recent.length >= limits.maxPerDomainPerHour ? recent[recent.length - limits.maxPerDomainPerHour]! + DOMAIN_WINDOW_MS : null;
}

/** The all-domains order limit's hold (pure): when the oldest order of a full 3 h window leaves it. */
export function orderHold(orders: readonly number[], now: number, limits: Limits = DEFAULT_LIMITS): number | null {
  const recent = orders.filter((t) => t > now - ORDER_WINDOW_MS).sort((a, b) => a - b);
  return recent.length >= limits.maxOrdersPer3h ? recent[recent.length - limits.maxOrdersPer3h]! + ORDER_WINDOW_MS : null;
}

/**
 * When the next ACME attempt for a domain may start (pure): the latest of the three holds, or
 * `now` when none holds it back. On a tie the first of schedule, hourly, orders names the reason.
 */
export function nextAllowed(
  entry: DomainBackoff | undefined,
  orders: readonly number[],
  acmeKey: string,
  now: number,
  limits: Limits = DEFAULT_LIMITS,
): { at: number; why: 'none' | 'backoff' | 'hourly' | 'orders' } {
  let at = now;
  let why: 'none' | 'backoff' | 'hourly' | 'orders' = 'none';
  const holds = [
    [scheduleHold(entry, acmeKey), 'backoff'],
    [hourlyHold(entry, now, limits), 'hourly'],
    [orderHold(orders, now, limits), 'orders'],
  ] as const;
  for (const [t, w] of holds) {
    if (t !== null && t > at) {
      at = t;
      why = w;
    }
  }
  return { at, why };
}

/**
 * How many attempts the domain could make in [now, now + 1 h) if every one of them failed
 * (pure; for dry-run). Follows the schedule and the hourly limit; ignores other domains.
 */
export function attemptsInNextHour(
  entry: DomainBackoff | undefined,
  acmeKey: string,
  now: number,
  limits: Limits = DEFAULT_LIMITS,
): number {
  let e: DomainBackoff = entry ? { ...entry, attempts: [...entry.attempts] } : { failedAttempts: 0, attempts: [] };
  let count = 0;
  const end = now + DOMAIN_WINDOW_MS;
  for (;;) {
    const { at } = nextAllowed(e, [], acmeKey, now, limits);
    const t = Math.max(at, now);
    if (t >= end || count >= 100) return count;
    count++;
    e = recordFailure(e, { at: t, error: '', acmeKey }, limits);
  }
}

/** A failed ACME attempt that started at `at` (pure). */
export function recordFailure(
  entry: DomainBackoff | undefined,
  f: { at: number; error: string; acmeKey: string; finishedAt?: number },
  limits: Limits = DEFAULT_LIMITS,
): DomainBackoff {
  const failedAttempts = (entry && entry.acmeKey === f.acmeKey ? entry.failedAttempts : 0) + 1;
  const end = f.finishedAt ?? f.at;
  return {
    failedAttempts,
    lastFailureTime: end,
    nextAttemptTime: end + delayAfter(failedAttempts, limits.schedule),
    lastError: f.error,
    lastReason: 'IssueFailed',
    acmeKey: f.acmeKey,
    attempts: [...(entry?.attempts ?? []).filter((t) => t > f.at - DOMAIN_WINDOW_MS), f.at],
  };
}

/** The domain does not resolve: report it, check again soon, spend no attempt (pure). */
export function recordDnsNotReady(entry: DomainBackoff | undefined, f: { at: number; error: string; acmeKey: string }): DomainBackoff {
  const { removed: _removed, ...rest } = entry ?? { failedAttempts: 0, attempts: [] };
  return {
    ...rest,
    lastError: f.error,
    lastReason: 'DNSNotReady',
    nextAttemptTime: Math.max(
      entry?.lastReason === 'IssueFailed' && entry.acmeKey === f.acmeKey ? (entry.nextAttemptTime ?? 0) : 0,
      f.at + DNS_RETRY_MS,
    ),
    ...(entry?.acmeKey === undefined ? { acmeKey: f.acmeKey } : {}),
  };
}

/**
 * The backoff file: loaded once, changed in memory. update() writes it at once (an ACME
 * attempt must be on disk before certbot spends it, and a failure's schedule must survive a
 * restart); change() only marks it dirty, and flush() writes every such change in one go: a
 * pass over hundreds of domains whose DNS is not there yet writes the file once, not once
 * per domain. Losing an unflushed change to a crash costs nothing but a DNS check.
 */
/** The persisted backoff: this gateway's file, or the fleet's row in its shared database. */
export interface Backoff {
  load(): Promise<BackoffFile>;
  get(domain: string): Promise<DomainBackoff | undefined>;
  /** Changes the data and persists it before resolving. */
  update(mutate: (data: BackoffFile) => void, now: number): Promise<void>;
  /** Changes the data in memory; the next flush() (or update()) persists it. */
  change(mutate: (data: BackoffFile) => void, now: number): Promise<void>;
  /** Persists what changed since the last write. */
  flush(): Promise<void>;
  /** Writes so far (for tests and metrics). */
  readonly writes: number;
}

/** Drops what no longer counts at `now`: orders past the 3 h window, removed domains past the hour. */
export function pruneBackoff(data: BackoffFile, now: number): void {
  data.orders = data.orders.filter((t) => t > now - ORDER_WINDOW_MS);
  for (const [d, e] of Object.entries(data.domains)) {
    if (e.removed && !e.attempts.some((t) => t > now - DOMAIN_WINDOW_MS)) delete data.domains[d];
  }
}

/** What every backoff does the same way over its own load, change and flush. */
abstract class BackoffBase implements Backoff {
  abstract load(): Promise<BackoffFile>;
  abstract change(mutate: (data: BackoffFile) => void, now: number): Promise<void>;
  abstract flush(): Promise<void>;
  abstract readonly writes: number;

  async get(domain: string): Promise<DomainBackoff | undefined> {
    return (await this.load()).domains[domain];
  }

  async update(mutate: (data: BackoffFile) => void, now: number): Promise<void> {
    await this.change(mutate, now);
    await this.flush();
  }
}

export class BackoffStore extends BackoffBase {
  readonly #path: string;
  #data: BackoffFile | null = null;
  #writing: Promise<void> = Promise.resolve();
  #dirty = false;
  #now = 0;
  /** Writes of the file so far (for tests and metrics). */
  writes = 0;

  constructor(path: string) {
    super();
    this.#path = path;
  }

  async load(): Promise<BackoffFile> {
    if (this.#data) return this.#data;
    try {
      const parsed = JSON.parse(await readFile(this.#path, 'utf8')) as Partial<BackoffFile>;
      this.#data = { version: 1, domains: parsed.domains ?? {}, orders: Array.isArray(parsed.orders) ? parsed.orders : [] };
    } catch (err) {
      // Missing: nothing failed yet. Corrupt: start over rather than never issue again; the
      // hard limits still hold from the next attempt on.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' && !(err instanceof SyntaxError)) throw err;
      this.#data = { version: 1, domains: {}, orders: [] };
    }
    return this.#data;
  }

  /** Changes the data in memory; the next flush() (or update()) writes it. */
  async change(mutate: (data: BackoffFile) => void, now: number): Promise<void> {
    const data = await this.load();
    mutate(data);
    this.#dirty = true;
    this.#now = Math.max(this.#now, now);
  }

  /** Writes the file if anything changed since the last write. */
  async flush(): Promise<void> {
    const run = this.#writing.then(async () => {
      if (!this.#dirty || this.#data === null) return;
      const data = this.#data;
      const now = this.#now;
      pruneBackoff(data, now);
      const text = `${JSON.stringify(data, null, 2)}\n`;
      this.#dirty = false;
      try {
        await writeAtomic(this.#path, text, { mode: 0o600, makeDir: true, dirMode: 0o700, fsyncFile: true });
        this.writes++;
      } catch (err) {
        this.#dirty = true; // written by the next flush
        throw err;
      }
    });
    this.#writing = run.catch(() => undefined);
    await run;
  }
}

/**
 * The fleet's backoff, in its shared database: every gateway's attempts count against the same
 * per-domain and per-account limits. Each load reads the row afresh; changes wait in memory and
 * are applied to the row as it is at the flush, under its lock, so two gateways' changes both
 * land.
 */
export class SharedBackoffStore extends BackoffBase {
  readonly #shared: SharedBackoffData;
  #pending: ((data: BackoffFile) => void)[] = [];
  #writing: Promise<void> = Promise.resolve();
  #now = 0;
  writes = 0;

  constructor(shared: SharedBackoffData) {
    super();
    this.#shared = shared;
  }

  async load(): Promise<BackoffFile> {
    const data = backoffFrom(await this.#shared.read());
    for (const mutate of this.#pending) mutate(data);
    return data;
  }

  async change(mutate: (data: BackoffFile) => void, now: number): Promise<void> {
    this.#pending.push(mutate);
    this.#now = Math.max(this.#now, now);
  }

  async flush(): Promise<void> {
    const run = this.#writing.then(async () => {
      if (this.#pending.length === 0) return;
      const taken = this.#pending;
      this.#pending = [];
      const now = this.#now;
      try {
        await this.#shared.change((data) => {
          for (const mutate of taken) mutate(data);
          pruneBackoff(data, now);
        });
        this.writes++;
      } catch (err) {
        this.#pending = [...taken, ...this.#pending]; // applied by the next flush
        throw err;
      }
    });
    this.#writing = run.catch(() => undefined);
    await run;
  }
}
