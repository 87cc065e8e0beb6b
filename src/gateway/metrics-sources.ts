// The gateway's /metrics sources: the controller's counters and statuses, the document, the
// access-log stats, the token checks, the store's refused writes, and every loop's own metric
// families (Nginx, tunnels, certificates).

import { createMetrics, type Metrics } from '../api/metrics.js';
import type { CountedAuth } from '../auth/counted.js';
import type { Controller } from '../reconcilers/controller.js';
import { SSH_LOOP } from '../reconcilers/ssh/index.js';
import { replicaObjectKey } from '../reconcilers/outputs.js';
import type { MetricFamily, ObjectStatus } from '../reconcilers/types.js';
import type { StatsCollector } from '../stats/index.js';
import type { StoredState } from '../state/store.js';
import type { GatewayLoops } from './loops.js';

export interface GatewayMetricSources {
  auth: CountedAuth;
  /** Writes storage refused since the start. */
  writeFailures: () => number;
}

export function gatewayMetrics(
  controller: Controller,
  current: () => StoredState,
  stats: StatsCollector,
  loops: GatewayLoops,
  sources: GatewayMetricSources,
): Metrics {
  return createMetrics({
    loops: () => controller.counters(),
    generation: () => current().generation,
    services: () => stats.totals(current().state),
    accessLog: () => stats.counters(),
    families: [
      ...loops.tls.metrics(),
      ...loops.nginx.metrics(),
      ...loops.ssh.metrics(),
      ...statusFamilies(controller, current),
      {
        name: 'auth_checks_total',
        help: "Token checks by the control server's answer (result: allow, deny, unauthenticated, or unavailable when it did not answer); cached answers included.",
        type: 'counter',
        labelNames: ['result'],
        read: () => Object.entries(sources.auth.counts()).map(([result, n]) => [{ result }, n]),
      },
      {
        name: 'state_write_failures_total',
        help: 'Changes the storage refused to write (disk full, read-only, no permission): answered 503, nothing applied.',
        type: 'counter',
        labelNames: [],
        read: () => [[{}, sources.writeFailures()]],
      },
    ],
  });
}

const isReady = (o: ObjectStatus | undefined): boolean => o?.conditions.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;

/** Figures read from the loops' statuses at each scrape: per loop its Ready, per service its replicas. */
function statusFamilies(controller: Controller, current: () => StoredState): MetricFamily[] {
  return [
    {
      name: 'loop_ready',
      help: 'Per reconcile loop: 1 while it is Ready (what the document asks is in place), 0 while it is converging or failing.',
      type: 'gauge',
      labelNames: ['loop'],
      read: () =>
        Object.entries(controller.statuses().loops).map(([loop, s]) => [
          { loop },
          s.conditions.some((c) => c.type === 'Ready' && c.status === 'True') ? 1 : 0,
        ]),
    },
    {
      name: 'service_replicas',
      help: 'Per service of the document: its replicas.',
      type: 'gauge',
      labelNames: ['project', 'run'],
      read: () => current().state.spec.services.map((s) => [{ project: s.project, run: s.run }, s.replicas.length]),
    },
    {
      name: 'service_ready_replicas',
      help: 'Per service of the document: its replicas reachable now (their tunnel, or direct address, Ready). 0 with replicas in the document: every request gets 503.',
      type: 'gauge',
      labelNames: ['project', 'run'],
      read: () => {
        const objects = controller.statuses().loops[SSH_LOOP]?.objects ?? {};
        return current().state.spec.services.map((s) => {
          const key = `${s.project}/${s.run}`;
          return [{ project: s.project, run: s.run }, s.replicas.filter((r) => isReady(objects[replicaObjectKey(key, r.id)])).length];
        });
      },
    },
  ];
}
