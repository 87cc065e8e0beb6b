// The Nginx loop's metric families: reload figures, the applied config's hash, and the private
// master's restarts and stale processes stopped.

import type { MetricFamily } from '../types.js';
import type { NginxLoopStats } from './loop.js';
import type { NginxProcessInfo } from './nginx-process.js';

/**
 * The Nginx metric families: the loop's reload figures and the applied config's hash, plus the
 * private master's restarts when there is one (`supervisor`).
 */
export function nginxMetricFamilies(stats: () => NginxLoopStats, supervisor?: () => NginxProcessInfo): MetricFamily[] {
  const one = (v: number | undefined) => (v === undefined ? [] : [[{}, v] as const]);
  return [
    { name: 'nginx_reloads_total', help: 'Successful Nginx reloads.', type: 'counter', labelNames: [], read: () => one(stats().reloads) },
    {
      name: 'nginx_reload_failures_total',
      help: 'Nginx reloads that failed (the previous config kept serving).',
      type: 'counter',
      labelNames: [],
      read: () => one(stats().reloadFailures),
    },
    {
      name: 'nginx_last_reload_success_timestamp_seconds',
      help: 'When Nginx last reloaded successfully (0: never).',
      type: 'gauge',
      labelNames: [],
      read: () => one((stats().lastReloadAt ?? 0) / 1000),
    },
    {
      name: 'nginx_files_written_total',
      help: 'Nginx config files written.',
      type: 'counter',
      labelNames: [],
      read: () => one(stats().filesWritten),
    },
    {
      name: 'nginx_reloads_deferred_total',
      help: 'Change batches that waited for the minimum interval between reloads, to go in with the changes made meanwhile.',
      type: 'counter',
      labelNames: [],
      read: () => one(stats().reloadsDeferred),
    },
    {
      name: 'nginx_reloads_hurried_total',
      help: 'Change batches reloaded inside the minimum interval because a registration was waiting for its new site.',
      type: 'counter',
      labelNames: [],
      read: () => one(stats().reloadsHurried),
    },
    {
      name: 'nginx_restarts_total',
      help: 'Restarts of the private Nginx master after it exited unexpectedly.',
      type: 'counter',
      labelNames: [],
      read: () => one(supervisor?.().restarts),
    },
    {
      name: 'nginx_stale_processes_stopped_total',
      help: 'Leftover Nginx processes of the private prefix (of a killed gateway or master) stopped before a start.',
      type: 'counter',
      labelNames: [],
      read: () => one(supervisor?.().staleStopped),
    },
    {
      name: 'nginx_config_info',
      help: 'The hash of the applied Nginx config (value always 1).',
      type: 'gauge',
      labelNames: ['hash'],
      read: () => {
        const hash = stats().configHash;
        return hash ? [[{ hash }, 1] as const] : [];
      },
    },
  ];
}
