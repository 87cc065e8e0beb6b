// Prometheus metrics on a private prom-client registry (never the global one: several gateways
// can live in one test process). Every figure is pulled at scrape time from a source function,
// so the loops keep plain counters and know nothing of Prometheus. Sources are optional and can
// be set later (`metrics.sources.tunnels = …`) by loops that do not exist yet.

import type { FastifyPluginAsync, onRequestHookHandler } from 'fastify';
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client';
import type { LoopCounters } from '../reconcilers/types.js';

type Maybe<T> = T | Promise<T>;

export interface NginxStatsSource {
  reloads: number;
  reloadFailures: number;
  /** ms since the epoch, or null before the first successful reload. */
  lastReloadAt: number | null;
  filesWritten: number;
  /** Batches that waited for the minimum interval between reloads (their changes went in together). */
  reloadsDeferred?: number;
  /** The private master's restarts after an unexpected exit (absent in system mode). */
  restarts?: number;
  /** Leftover Nginx processes of the private prefix (a killed gateway's or master's) stopped. */
  staleStopped?: number;
}

export interface TunnelMetric {
  service: string;
  replica: string;
  /** Ready = 1 in dstack_proxy_tunnel_up. */
  state: string;
  reconnects: number;
}

export interface CertificateMetric {
  domain: string;
  /** ms since the epoch, or null without a certificate. */
  notAfter: number | null;
  failedAttempts: number;
}

export interface ServiceRequestMetric {
  project: string;
  run: string;
  requests: number;
  requestTimeSeconds: number;
}

export interface AccessLogMetric {
  lines: number;
  skipped: number;
  rotations: number;
  truncations: number;
}

export interface MetricsSources {
  /** controller.counters() */
  loops?: () => Record<string, LoopCounters>;
  /** The Nginx loop's `stats` (NginxLoopStats). */
  nginx?: () => NginxStatsSource;
  /** sha256 of the applied Nginx config, when known. */
  nginxConfigHash?: () => string | null;
  /** The stored document's generation. */
  generation?: () => Maybe<number>;
  /** Per service totals from the stats collector (collector.totals(state)). */
  services?: () => Maybe<ServiceRequestMetric[]>;
  /** The stats collector's counters. */
  accessLog?: () => AccessLogMetric;
  /** From the SSH loop, once it exists. */
  tunnels?: () => Maybe<TunnelMetric[]>;
  /** From the TLS loop, once it exists. */
  certificates?: () => Maybe<CertificateMetric[]>;
}

export interface Metrics {
  registry: Registry;
  /** Mutable: assign a source when its loop starts. */
  sources: MetricsSources;
  text(): Promise<string>;
  contentType: string;
}

const P = 'dstack_proxy_';

export function createMetrics(sources: MetricsSources = {}, opts: { defaultMetrics?: boolean } = {}): Metrics {
  const registry = new Registry();
  const src: MetricsSources = { ...sources };
  const registers = [registry];
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: P });

  /** A counter whose value is a monotonic figure kept elsewhere: reset and re-set at each scrape. */
  function pulledCounter<L extends string>(name: string, help: string, labelNames: readonly L[], read: () => Promise<[Partial<Record<L, string>>, number][]>): void {
    new Counter<L>({
      name: P + name,
      help,
      labelNames,
      registers,
      async collect() {
        const rows = await read();
        this.reset();
        for (const [labels, v] of rows) if (v >= 0 && Number.isFinite(v)) this.inc(labels, v);
      },
    });
  }
  function pulledGauge<L extends string>(name: string, help: string, labelNames: readonly L[], read: () => Promise<[Partial<Record<L, string>>, number][]>): void {
    new Gauge<L>({
      name: P + name,
      help,
      labelNames,
      registers,
      async collect() {
        const rows = await read();
        this.reset();
        for (const [labels, v] of rows) this.set(labels, v);
      },
    });
  }

  const loops = async () => Object.entries(src.loops?.() ?? {});
  pulledCounter('reconcile_passes_total', 'Reconcile passes per loop.', ['loop'], async () => (await loops()).map(([loop, c]) => [{ loop }, c.passes]));
  pulledCounter('reconcile_errors_total', 'Failed passes plus failed actions per loop.', ['loop'], async () => (await loops()).map(([loop, c]) => [{ loop }, c.errors]));
  pulledCounter('reconcile_actions_applied_total', 'Actions applied per loop.', ['loop'], async () => (await loops()).map(([loop, c]) => [{ loop }, c.actionsApplied]));
  pulledGauge('reconcile_last_pass_duration_seconds', 'Duration of the last reconcile pass per loop.', ['loop'], async () =>
    (await loops()).map(([loop, c]) => [{ loop }, c.lastPassDurationMs / 1000]),
  );

  const nginx = (pick: (s: NginxStatsSource) => number | null) => async (): Promise<[Record<never, string>, number][]> => {
    const s = src.nginx?.();
    if (!s) return [];
    const v = pick(s);
    return v === null ? [] : [[{}, v]];
  };
  pulledCounter('nginx_reloads_total', 'Successful Nginx reloads.', [], nginx((s) => s.reloads));
  pulledCounter('nginx_reload_failures_total', 'Nginx reloads that failed (the previous config kept serving).', [], nginx((s) => s.reloadFailures));
  pulledGauge('nginx_last_reload_success_timestamp_seconds', 'When Nginx last reloaded successfully (0: never).', [], nginx((s) => (s.lastReloadAt ?? 0) / 1000));
  pulledCounter('nginx_files_written_total', 'Nginx config files written.', [], nginx((s) => s.filesWritten));
  pulledCounter(
    'nginx_reloads_deferred_total',
    'Change batches that waited for the minimum interval between reloads, to go in with the changes made meanwhile.',
    [],
    nginx((s) => s.reloadsDeferred ?? null),
  );
  pulledCounter('nginx_restarts_total', 'Restarts of the private Nginx master after it exited unexpectedly.', [], nginx((s) => s.restarts ?? null));
  pulledCounter(
    'nginx_stale_processes_stopped_total',
    'Leftover Nginx processes of the private prefix (of a killed gateway or master) stopped before a start.',
    [],
    nginx((s) => s.staleStopped ?? null),
  );
  pulledGauge('nginx_config_info', 'The hash of the applied Nginx config (value always 1).', ['hash'], async () => {
    const h = src.nginxConfigHash?.();
    return h ? [[{ hash: h }, 1]] : [];
  });

  pulledGauge('document_generation', 'Generation of the stored desired-state document.', [], async () => {
    if (!src.generation) return [];
    return [[{}, await src.generation()]];
  });

  const services = async () => (src.services ? await src.services() : []);
  pulledCounter('service_requests_total', 'Requests that reached a service (access log, replica hits only).', ['project', 'run'], async () =>
    (await services()).map((s) => [{ project: s.project, run: s.run }, s.requests]),
  );
  pulledCounter('service_request_duration_seconds_total', 'Sum of request times of those requests.', ['project', 'run'], async () =>
    (await services()).map((s) => [{ project: s.project, run: s.run }, s.requestTimeSeconds]),
  );

  const log = (pick: (a: AccessLogMetric) => number) => async (): Promise<[Record<never, string>, number][]> => {
    const a = src.accessLog?.();
    return a ? [[{}, pick(a)]] : [];
  };
  pulledCounter('access_log_lines_total', 'Access-log lines read.', [], log((a) => a.lines));
  pulledCounter('access_log_skipped_lines_total', 'Access-log lines skipped as malformed.', [], log((a) => a.skipped));
  pulledCounter('access_log_rotations_total', 'Access-log rotations noticed.', [], log((a) => a.rotations));
  pulledCounter('access_log_truncations_total', 'Access-log truncations noticed.', [], log((a) => a.truncations));

  const tunnels = async () => (src.tunnels ? await src.tunnels() : []);
  pulledGauge('tunnel_up', 'Per replica tunnel: 1 when Ready.', ['service', 'replica', 'state'], async () =>
    (await tunnels()).map((t) => [{ service: t.service, replica: t.replica, state: t.state }, t.state === 'Ready' ? 1 : 0]),
  );
  pulledCounter('tunnel_reconnects_total', 'Per replica tunnel reconnects.', ['service', 'replica'], async () =>
    (await tunnels()).map((t) => [{ service: t.service, replica: t.replica }, t.reconnects]),
  );

  const certs = async () => (src.certificates ? await src.certificates() : []);
  pulledGauge('certificate_expiry_timestamp_seconds', 'Per domain certificate notAfter.', ['domain'], async () =>
    (await certs()).filter((c) => c.notAfter !== null).map((c) => [{ domain: c.domain }, (c.notAfter ?? 0) / 1000]),
  );
  pulledCounter('certificate_failed_attempts_total', 'Per domain failed certificate requests.', ['domain'], async () =>
    (await certs()).map((c) => [{ domain: c.domain }, c.failedAttempts]),
  );

  return {
    registry,
    sources: src,
    text: () => registry.metrics(),
    contentType: registry.contentType,
  };
}

export interface MetricsRoutesOptions {
  metrics: Metrics;
  guard?: onRequestHookHandler;
}

/** `GET /metrics` in the Prometheus text format. */
export const metricsRoutes: FastifyPluginAsync<MetricsRoutesOptions> = async (app, { metrics, guard }) => {
  app.get('/metrics', guard ? { onRequest: guard } : {}, async (_req, reply) => {
    const text = await metrics.text();
    return reply.header('content-type', metrics.contentType).send(text);
  });
};
