// The stats collector: tails the Nginx access log into per-host frames and answers dstack's
// `GET /api/stats/collect` for every service of the document that has a domain.

import type { Logger } from 'pino';
import type { ProxyState } from '../spec/types.js';
import { systemClock, type Clock, type TimerHandle } from '../clock.js';
import { DEFAULT_MAX_HOSTS, FrameTable, type ServiceStats } from './frames.js';
import { newParseCounters, parseLines, type ParseCounters } from './parse.js';
import { LogTail, type TailCounters } from './tail.js';

export type { ServiceStats };

export interface ServiceTotals {
  project: string;
  run: string;
  domain: string;
  /** Since the collector started (monotonic: Prometheus counters). */
  requests: number;
  requestTimeSeconds: number;
  /** Those requests by status class: index 1-5 for 1xx-5xx, 0 for anything else. */
  byClass: ArrayLike<number>;
}

export interface StatsCounters extends ParseCounters, TailCounters {
  /** Malformed lines plus overlong and half lines dropped by the tail. */
  skipped: number;
  /** Lines for hosts beyond maxHosts. */
  droppedHosts: number;
  hosts: number;
}

export interface StatsCollectorOptions {
  accessLogPath: string;
  clock?: Clock;
  /** Background read interval. Default 1 s; collect() also reads first. */
  pollIntervalMs?: number;
  /** See LogTailOptions. Default 'end': a restart does not recount old lines. */
  startAt?: 'end' | 'start';
  rotateGraceMs?: number;
  chunkBytes?: number;
  maxHosts?: number;
  logger?: Logger;
}

export interface StatsCollector {
  /** Start the background poll (idempotent). */
  start(): void;
  /** Stop polling and close the log files. */
  stop(): Promise<void>;
  /** Read what was appended since the last poll. */
  poll(): Promise<void>;
  /** poll(), then snapshot(). */
  collect(state: ProxyState): Promise<ServiceStats[]>;
  /** The answer from what was read so far: every service with a domain, zeros when idle. */
  snapshot(state: ProxyState): ServiceStats[];
  /** Running totals per service with a domain, for metrics. */
  totals(state: ProxyState): ServiceTotals[];
  counters(): StatsCounters;
  readonly frames: FrameTable;
}

export const DEFAULT_STATS_POLL_MS = 1_000; // 1 s

const NO_CLASSES: readonly number[] = [0, 0, 0, 0, 0, 0];

export function createStatsCollector(o: StatsCollectorOptions): StatsCollector {
  const clock = o.clock ?? systemClock;
  const pollIntervalMs = o.pollIntervalMs ?? DEFAULT_STATS_POLL_MS;
  const frames = new FrameTable(o.maxHosts ?? DEFAULT_MAX_HOSTS);
  const parse = newParseCounters();
  const tail = new LogTail({
    path: o.accessLogPath,
    consume: (b, start, end) => parseLines(b, start, end, frames, parse),
    clock,
    ...(o.startAt ? { startAt: o.startAt } : {}),
    ...(o.rotateGraceMs !== undefined ? { rotateGraceMs: o.rotateGraceMs } : {}),
    ...(o.chunkBytes !== undefined ? { chunkBytes: o.chunkBytes } : {}),
  });
  let timer: TimerHandle | null = null;
  let running = false;
  let lastError = '';

  const poll = async (): Promise<void> => {
    try {
      await tail.poll();
      lastError = '';
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      if (message !== lastError) o.logger?.warn({ err: message, path: o.accessLogPath }, 'cannot read the access log');
      lastError = message;
    }
  };

  const schedule = (): void => {
    if (!running) return;
    timer = clock.setTimeout(() => {
      void poll().finally(schedule);
    }, pollIntervalMs);
  };

  const snapshot = (state: ProxyState): ServiceStats[] =>
    frames.serviceStats(state.spec.services, (s) => s.domain || undefined, Math.floor(clock.now() / 1000));

  return {
    frames,
    start() {
      if (running) return;
      running = true;
      void poll().finally(schedule);
    },
    async stop() {
      running = false;
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
      await tail.close();
    },
    poll,
    async collect(state) {
      await poll();
      return snapshot(state);
    },
    snapshot,
    totals(state) {
      const out: ServiceTotals[] = [];
      for (const s of state.spec.services) {
        if (!s.domain) continue;
        const h = frames.get(s.domain);
        out.push({
          project: s.project,
          run: s.run,
          domain: s.domain,
          requests: h?.totalRequests ?? 0,
          requestTimeSeconds: (h?.totalTimeMs ?? 0) / 1000,
          byClass: h?.byClass ?? NO_CLASSES,
        });
      }
      return out;
    },
    counters() {
      return {
        ...parse,
        ...tail.counters,
        skipped: parse.malformed + tail.counters.dropped,
        droppedHosts: frames.dropped,
        hosts: frames.size,
      };
    },
  };
}
