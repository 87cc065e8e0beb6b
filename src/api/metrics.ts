// Prometheus metrics on a private prom-client registry (never the global one: several gateways
// can live in one test process). Every figure is pulled at scrape time, so the loops keep plain
// counters and know nothing of Prometheus: each loop describes its own metric families
// (Loop.metrics(): name, help, labels and a read function), and the daemon's own figures (loop
// counters, the document generation, the access log) come from the sources below.

import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client';
import type { LoopCounters, MetricFamily, MetricSample } from '../reconcilers/types.js';

type Maybe<T> = T | Promise<T>;

export interface ServiceRequestMetric {
  project: string;
  run: string;
  requests: number;
  requestTimeSeconds: number;
  /** Those requests by status class: index 1-5 for 1xx-5xx, 0 for anything else. */
  byClass?: ArrayLike<number>;
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
  /** The stored document's generation. */
  generation?: () => Maybe<number>;
  /** Per service totals from the stats collector (collector.totals(state)). */
  services?: () => Maybe<ServiceRequestMetric[]>;
  /** The stats collector's counters. */
  accessLog?: () => AccessLogMetric;
  /** The loops' metric families (each loop's metrics()), registered as they are. */
  families?: readonly MetricFamily[];
}

export interface Metrics {
  registry: Registry;
  text(): Promise<string>;
  contentType: string;
}

const P = 'dstack_proxy_';
/** A status class's label, by the status's first digit (0: none of 1-5). */
const CLASS_NAMES = ['other', '1xx', '2xx', '3xx', '4xx', '5xx'];

export function createMetrics(sources: MetricsSources = {}, opts: { defaultMetrics?: boolean } = {}): Metrics {
  const registry = new Registry();
  const registers = [registry];
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: P });

  /**
   * A family whose figures are kept elsewhere: reset and re-set at each scrape. A counter's
   * value is a monotonic figure read as it is (negative or non-finite values are left out).
   */
  function pulled(f: MetricFamily): void {
    const common = { name: P + f.name, help: f.help, labelNames: f.labelNames, registers };
    if (f.type === 'counter') {
      new Counter({
        ...common,
        async collect() {
          const rows = await f.read();
          this.reset();
          for (const [labels, v] of rows) if (v >= 0 && Number.isFinite(v)) this.inc({ ...labels }, v);
        },
      });
    } else {
      new Gauge({
        ...common,
        async collect() {
          const rows = await f.read();
          this.reset();
          for (const [labels, v] of rows) this.set({ ...labels }, v);
        },
      });
    }
  }
  const family = (
    type: MetricFamily['type'],
    name: string,
    help: string,
    labelNames: readonly string[],
    read: () => Promise<MetricSample[]>,
  ): void => pulled({ name, help, type, labelNames, read });

  const loops = async () => Object.entries(sources.loops?.() ?? {});
  family('counter', 'reconcile_passes_total', 'Reconcile passes per loop.', ['loop'], async () =>
    (await loops()).map(([loop, c]) => [{ loop }, c.passes]),
  );
  family('counter', 'reconcile_errors_total', 'Failed passes plus failed actions per loop.', ['loop'], async () =>
    (await loops()).map(([loop, c]) => [{ loop }, c.errors]),
  );
  family('counter', 'reconcile_actions_applied_total', 'Actions applied per loop.', ['loop'], async () =>
    (await loops()).map(([loop, c]) => [{ loop }, c.actionsApplied]),
  );
  family('gauge', 'reconcile_last_pass_duration_seconds', 'Duration of the last reconcile pass per loop.', ['loop'], async () =>
    (await loops()).map(([loop, c]) => [{ loop }, c.lastPassDurationMs / 1000]),
  );

  family('gauge', 'document_generation', 'Generation of the stored desired-state document.', [], async () => {
    if (!sources.generation) return [];
    return [[{}, await sources.generation()]];
  });

  const services = async () => (sources.services ? await sources.services() : []);
  family(
    'counter',
    'service_requests_total',
    'Requests that reached a service (access log, replica hits only).',
    ['project', 'run'],
    async () => (await services()).map((s) => [{ project: s.project, run: s.run }, s.requests]),
  );
  family('counter', 'service_request_duration_seconds_total', 'Sum of request times of those requests.', ['project', 'run'], async () =>
    (await services()).map((s) => [{ project: s.project, run: s.run }, s.requestTimeSeconds]),
  );
  family(
    'counter',
    'service_responses_total',
    'Those requests by the class of their status (code: 2xx ... 5xx, or other).',
    ['project', 'run', 'code'],
    async () =>
      (await services()).flatMap((s) =>
        s.byClass ? CLASS_NAMES.map((code, i): MetricSample => [{ project: s.project, run: s.run, code }, s.byClass![i]!]) : [],
      ),
  );

  const log = (pick: (a: AccessLogMetric) => number) => async (): Promise<MetricSample[]> => {
    const a = sources.accessLog?.();
    return a ? [[{}, pick(a)]] : [];
  };
  family(
    'counter',
    'access_log_lines_total',
    'Access-log lines read.',
    [],
    log((a) => a.lines),
  );
  family(
    'counter',
    'access_log_skipped_lines_total',
    'Access-log lines skipped as malformed.',
    [],
    log((a) => a.skipped),
  );
  family(
    'counter',
    'access_log_rotations_total',
    'Access-log rotations noticed.',
    [],
    log((a) => a.rotations),
  );
  family(
    'counter',
    'access_log_truncations_total',
    'Access-log truncations noticed.',
    [],
    log((a) => a.truncations),
  );

  for (const f of sources.families ?? []) pulled(f);

  return {
    registry,
    text: () => registry.metrics(),
    contentType: registry.contentType,
  };
}

export interface MetricsRoutesOptions {
  metrics: Metrics;
  guard?: (request: FastifyRequest) => Promise<void>;
}

/** `GET /metrics` in the Prometheus text format. */
export const metricsRoutes: FastifyPluginAsync<MetricsRoutesOptions> = async (app, { metrics, guard }) => {
  app.get('/metrics', guard ? { onRequest: guard } : {}, async (_req, reply) => {
    const text = await metrics.text();
    return reply.header('content-type', metrics.contentType).send(text);
  });
};
