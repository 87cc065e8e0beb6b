// The gateway's /metrics sources: the controller's counters, the document, the access-log
// stats, and what the loops know about Nginx, tunnels and certificates.

import { createMetrics, type CertificateMetric, type Metrics, type TunnelMetric } from '../api/metrics.js';
import type { Controller } from '../reconcilers/controller.js';
import type { NginxProcess } from '../reconcilers/nginx/nginx-process.js';
import { SSH_LOOP, type SshLoop } from '../reconcilers/ssh/index.js';
import type { TlsLoop } from '../reconcilers/tls/index.js';
import type { StatusSnapshot } from '../reconcilers/types.js';
import type { ProxyState } from '../spec/index.js';
import type { StatsCollector } from '../stats/index.js';
import type { StoredState } from '../state/store.js';
import type { GatewayLoops } from './loops.js';

export function gatewayMetrics(
  controller: Controller,
  current: () => StoredState,
  stats: StatsCollector,
  loops: GatewayLoops,
  nginx: NginxProcess | undefined,
): Metrics {
  return createMetrics({
    loops: () => controller.counters(),
    nginx: () => ({ ...loops.nginx.stats, ...(nginx ? { restarts: nginx.info.restarts, staleStopped: nginx.info.staleStopped } : {}) }),
    nginxConfigHash: () => loops.nginx.stats.configHash,
    generation: () => current().generation,
    services: () => stats.totals(current().state),
    accessLog: () => stats.counters(),
    tunnels: () => tunnelMetrics(controller.statuses(), loops.ssh),
    certificates: () => certificateMetrics(current().state, loops.tls),
  });
}

function tunnelMetrics(statuses: StatusSnapshot, ssh: SshLoop): TunnelMetric[] {
  const out: TunnelMetric[] = [];
  for (const [key, { conditions }] of Object.entries(statuses.loops[SSH_LOOP]?.objects ?? {})) {
    const ready = conditions.find((c) => c.type === 'Ready');
    const slash = key.lastIndexOf('/');
    const replica = key.slice(slash + 1);
    out.push({
      service: key.slice(0, slash),
      replica,
      state: ready?.status === 'True' ? 'Ready' : (ready?.reason ?? 'Unknown'),
      reconnects: Math.max(0, ssh.connects(replica) - 1),
    });
  }
  return out;
}

function certificateMetrics(state: ProxyState, tls: TlsLoop): CertificateMetric[] {
  const domains = [...state.spec.services, ...state.spec.entrypoints].filter((o) => o.https && o.domain).map((o) => o.domain!);
  return domains.map((domain) => {
    const info = tls.domainInfo(domain);
    return { domain, notAfter: info?.cert ? info.cert.notAfter : null, failedAttempts: info?.failedAttempts ?? 0 };
  });
}
