// The gateway's /metrics sources: the controller's counters, the document, the access-log
// stats, and every loop's own metric families (Nginx, tunnels, certificates).

import { createMetrics, type Metrics } from '../api/metrics.js';
import type { Controller } from '../reconcilers/controller.js';
import type { StatsCollector } from '../stats/index.js';
import type { StoredState } from '../state/store.js';
import type { GatewayLoops } from './loops.js';

export function gatewayMetrics(controller: Controller, current: () => StoredState, stats: StatsCollector, loops: GatewayLoops): Metrics {
  return createMetrics({
    loops: () => controller.counters(),
    generation: () => current().generation,
    services: () => stats.totals(current().state),
    accessLog: () => stats.counters(),
    families: [...loops.tls.metrics(), ...loops.nginx.metrics(), ...loops.ssh.metrics()],
  });
}
