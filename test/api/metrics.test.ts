// /metrics over a real gateway (private Nginx): the text is valid Prometheus exposition format
// and the figures move (a reload → reload counter +1, requests → service counter).

import type { Server } from 'node:http';
import { join } from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMetrics, metricsRoutes, type Metrics } from '../../src/api/metrics.js';
import { startGateway, type Gateway } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { nginxMetricFamilies } from '../../src/reconcilers/nginx/metrics.js';
import type { CertificateOutputs } from '../../src/reconcilers/outputs.js';
import { StatusStore } from '../../src/reconcilers/status.js';
import { createTlsLoop } from '../../src/reconcilers/tls/index.js';
import type { MetricFamily, MetricSample, StatusWriter } from '../../src/reconcilers/types.js';
import { createStatsCollector, type StatsCollector } from '../../src/stats/index.js';
import { close, request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/**
 * A strict reader of the text format 0.0.4: HELP/TYPE lines, then `name{l="v",…} value`. Values
 * as Prometheus's own parser (Go's ParseFloat) takes them: prom-client writes NaN as "Nan".
 */
export function parseExposition(text: string): { types: Map<string, string>; samples: Sample[] } {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const sampleRe = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (-?[0-9.eE+-]+|[Nn]a[Nn]|[+-]?Inf)(?: -?\\d+)?$`);
  const labelRe = /^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(?:,|$)/;
  expect(text.endsWith('\n')).toBe(true);
  for (const line of text.slice(0, -1).split('\n')) {
    if (line === '') continue;
    let m: RegExpExecArray | null;
    if ((m = new RegExp(`^# HELP (${NAME}) .*$`).exec(line))) continue;
    if ((m = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`).exec(line))) {
      expect(types.has(m[1]!), `TYPE twice for ${m[1]}`).toBe(false);
      types.set(m[1]!, m[2]!);
      continue;
    }
    m = sampleRe.exec(line);
    if (!m) throw new Error(`not a valid exposition line: ${line}`);
    const labels: Record<string, string> = {};
    let rest = m[2] ?? '';
    while (rest !== '') {
      const l = labelRe.exec(rest);
      if (!l) throw new Error(`bad labels in: ${line}`);
      labels[l[1]!] = l[2]!;
      rest = rest.slice(l[0].length);
    }
    const base = m[1]!.replace(/_(bucket|sum|count|total|created)$/, '');
    if (!types.has(m[1]!) && !types.has(base)) throw new Error(`sample without TYPE: ${line}`);
    samples.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return { types, samples };
}

let tmp: ReturnType<typeof tmpDir>;
let gw: Gateway;
let echo: Server;
let echoPort: number;
let httpPort: number;
let sc: StatsCollector;
let metrics: Metrics;
let app: FastifyInstance;
/** The status of a TLS loop of our own, whose families the metrics below register. */
let tlsStatus: StatusWriter;
/** Rows of loop families that have nothing to report at assembly. */
let tunnelRows: MetricSample[] = [];
let reconnectRows: MetricSample[] = [];

async function scrape(
  target: { inject: FastifyInstance['inject'] } = app,
): Promise<{ types: Map<string, string>; value: (name: string, labels?: Record<string, string>) => number | undefined }> {
  const r = await target.inject({ method: 'GET', url: '/metrics' });
  expect(r.statusCode).toBe(200);
  expect(r.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
  const { types, samples } = parseExposition(r.body);
  return {
    types,
    value: (name, labels = {}) =>
      samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value,
  };
}

function doc(runs: string[]) {
  return {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'main' }],
      services: runs.map((run) => ({
        project: 'main',
        run,
        domain: `${run}.gw.test`,
        https: false,
        auth: false,
        replicas: [{ id: `r-${run}`, appPort: 8000, direct: { host: '127.0.0.1', port: echoPort } }],
      })),
    },
  };
}

beforeAll(async () => {
  tmp = tmpDir('dp-metrics-');
  const [hp, httpsPort, p] = (await freePorts(3)) as [number, number, number];
  echoPort = p;
  httpPort = hp;
  echo = await startEcho('replica', { port: echoPort });
  const options = resolveOptions({
    flags: {
      stateDir: join(tmp.dir, 'state'),
      apiPort: '0',
      httpPort: String(httpPort),
      httpsPort: String(httpsPort),
      listenHost: '127.0.0.1',
      logLevel: 'silent',
    },
  });
  gw = await startGateway(options);
  sc = createStatsCollector({ accessLogPath: gw.paths.accessLog, startAt: 'start' });
  const tls = createTlsLoop({ stateDir: join(tmp.dir, 'tls'), acmeWebroot: join(tmp.dir, 'acme') });
  tlsStatus = new StatusStore({ now: Date.now, generation: () => 1, onChange: () => {} }).writer();
  tls.start({ status: tlsStatus, trigger: () => {} });
  const tunnels: MetricFamily[] = [
    {
      name: 'tunnel_up',
      help: 'Per replica tunnel: 1 when Ready.',
      type: 'gauge',
      labelNames: ['service', 'replica', 'state'],
      read: () => tunnelRows,
    },
    {
      name: 'tunnel_reconnects_total',
      help: 'Per replica tunnel reconnects.',
      type: 'counter',
      labelNames: ['service', 'replica'],
      read: () => reconnectRows,
    },
  ];
  metrics = createMetrics({
    loops: () => gw.controller.counters(),
    generation: async () => (await gw.store.read()).generation,
    services: async () => sc.totals((await gw.store.read()).state),
    accessLog: () => sc.counters(),
    families: [...nginxMetricFamilies(() => gw.nginxStats), ...tls.metrics(), ...tunnels],
  });
  app = Fastify();
  await app.register(metricsRoutes, { metrics });
});

afterAll(async () => {
  await app?.close();
  await sc?.stop();
  await gw?.close();
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('GET /metrics', () => {
  it('is valid exposition text with every metric family typed', async () => {
    const m = await scrape();
    for (const [name, type] of [
      ['dstack_proxy_reconcile_passes_total', 'counter'],
      ['dstack_proxy_reconcile_last_pass_duration_seconds', 'gauge'],
      ['dstack_proxy_nginx_reloads_total', 'counter'],
      ['dstack_proxy_nginx_last_reload_success_timestamp_seconds', 'gauge'],
      ['dstack_proxy_document_generation', 'gauge'],
      ['dstack_proxy_service_requests_total', 'counter'],
      ['dstack_proxy_tunnel_up', 'gauge'],
      ['dstack_proxy_certificate_expiry_timestamp_seconds', 'gauge'],
    ]) {
      expect(m.types.get(name!), name).toBe(type);
    }
    expect(m.value('dstack_proxy_reconcile_passes_total', { loop: 'nginx' })).toBeGreaterThanOrEqual(1);
    expect(m.value('dstack_proxy_document_generation')).toBe(0);

    // The gateway's own /metrics registers every loop's families.
    const own = await scrape(gw.app);
    for (const [name, type] of [
      ['dstack_proxy_reconcile_passes_total', 'counter'],
      ['dstack_proxy_nginx_reloads_total', 'counter'],
      ['dstack_proxy_nginx_reload_failures_total', 'counter'],
      ['dstack_proxy_nginx_last_reload_success_timestamp_seconds', 'gauge'],
      ['dstack_proxy_nginx_files_written_total', 'counter'],
      ['dstack_proxy_nginx_reloads_deferred_total', 'counter'],
      ['dstack_proxy_nginx_reloads_hurried_total', 'counter'],
      ['dstack_proxy_nginx_restarts_total', 'counter'],
      ['dstack_proxy_nginx_stale_processes_stopped_total', 'counter'],
      ['dstack_proxy_nginx_config_info', 'gauge'],
      ['dstack_proxy_document_generation', 'gauge'],
      ['dstack_proxy_service_requests_total', 'counter'],
      ['dstack_proxy_access_log_lines_total', 'counter'],
      ['dstack_proxy_tunnel_up', 'gauge'],
      ['dstack_proxy_tunnel_reconnects_total', 'counter'],
      ['dstack_proxy_certificate_expiry_timestamp_seconds', 'gauge'],
      ['dstack_proxy_certificate_failed_attempts_total', 'counter'],
    ]) {
      expect(own.types.get(name!), name).toBe(type);
    }
    expect(own.value('dstack_proxy_nginx_restarts_total')).toBe(0);
    expect(own.value('dstack_proxy_nginx_config_info', { hash: gw.nginxStats.configHash! })).toBe(1);
  });

  it('a new document → one reload → reload counter +1, generation +1; requests move the service counter', async () => {
    const before = await scrape();
    const reloads = before.value('dstack_proxy_nginx_reloads_total') ?? 0;
    const put = await gw.app.inject({ method: 'PUT', url: '/api/v1/state', payload: doc(['alpha']) });
    expect(put.statusCode).toBe(200);
    await eventually(() => (gw.nginxStats.reloads > reloads ? true : undefined));
    const after = await scrape();
    expect(after.value('dstack_proxy_nginx_reloads_total')).toBe(reloads + 1);
    expect(after.value('dstack_proxy_nginx_reload_failures_total')).toBe(0);
    expect(after.value('dstack_proxy_nginx_last_reload_success_timestamp_seconds')).toBeGreaterThan(Date.now() / 1000 - 600);
    expect(after.value('dstack_proxy_document_generation')).toBe(1);
    expect(after.value('dstack_proxy_service_requests_total', { project: 'main', run: 'alpha' })).toBe(0);

    for (let i = 0; i < 7; i++) {
      const rr = await request({ port: httpPort, host: 'alpha.gw.test', localAddress: '127.0.0.2' });
      expect(rr.status).toBe(200);
    }
    await eventually(async () => {
      await sc.poll();
      return sc.counters().hits >= 7 ? true : undefined;
    });
    const moved = await scrape();
    expect(moved.value('dstack_proxy_service_requests_total', { project: 'main', run: 'alpha' })).toBe(7);
    expect(moved.value('dstack_proxy_service_request_duration_seconds_total', { project: 'main', run: 'alpha' })).toBeGreaterThanOrEqual(0);
    expect(moved.value('dstack_proxy_access_log_lines_total')).toBeGreaterThanOrEqual(7);
  });

  it('what loops publish after assembly shows up at the next scrape', async () => {
    const before = await scrape();
    expect(before.value('dstack_proxy_tunnel_up', { service: 'main/alpha', replica: 'r1' })).toBeUndefined();
    expect(before.value('dstack_proxy_certificate_failed_attempts_total', { domain: 'alpha.gw.test' })).toBeUndefined();
    tunnelRows = [[{ service: 'main/alpha', replica: 'r1', state: 'Ready' }, 1]];
    reconnectRows = [[{ service: 'main/alpha', replica: 'r1' }, 2]];
    const cert: CertificateOutputs = {
      serial: 'AB01',
      certPath: '/c/alpha/AB01/fullchain.pem',
      keyPath: '/c/alpha/AB01/privkey.pem',
      notAfter: new Date(Date.UTC(2030, 0, 1)).toISOString(),
      renewalTime: new Date(Date.UTC(2029, 9, 1)).toISOString(),
      failedAttempts: 1,
      nextAttemptTime: null,
      lastError: null,
    };
    tlsStatus.setOutputs('alpha.gw.test', cert);
    tlsStatus.setOutputs('pending.gw.test', {
      ...cert,
      serial: null,
      certPath: null,
      keyPath: null,
      notAfter: null,
      renewalTime: null,
      failedAttempts: 3,
    });
    const m = await scrape();
    expect(m.value('dstack_proxy_tunnel_up', { service: 'main/alpha', replica: 'r1' })).toBe(1);
    expect(m.value('dstack_proxy_tunnel_reconnects_total', { replica: 'r1' })).toBe(2);
    expect(m.value('dstack_proxy_certificate_expiry_timestamp_seconds', { domain: 'alpha.gw.test' })).toBe(Date.UTC(2030, 0, 1) / 1000);
    expect(m.value('dstack_proxy_certificate_failed_attempts_total', { domain: 'alpha.gw.test' })).toBe(1);
    // No certificate served: no expiry, but its failed attempts.
    expect(m.value('dstack_proxy_certificate_expiry_timestamp_seconds', { domain: 'pending.gw.test' })).toBeUndefined();
    expect(m.value('dstack_proxy_certificate_failed_attempts_total', { domain: 'pending.gw.test' })).toBe(3);
  });
});
