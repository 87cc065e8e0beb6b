// The alert rules and the Grafana dashboard of docs/monitoring, against the real tools: promtool
// checks the rules, and a real Prometheus (Debian's package) scrapes a real gateway (its private
// Nginx, a replica behind a real sshd, a certificate from Pebble through certbot, the control
// server answering token checks). Every query of the dashboard returns data, every metric an
// alert reads exists, and the alerts whose cause a test can bring about fire when it does: a
// killed sshd (a tunnel down, a service with no ready replica), an unreachable ACME server (a
// certificate failing), a control server gone (token checks unavailable) and, on a second
// gateway over an operator's Nginx whose reload command fails, Nginx refusing reloads.

import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { execa } from 'execa';
import { writeMainConf } from '../../src/reconcilers/nginx/nginx-process.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { startPebble, type TestPebble } from '../helpers/pebble.js';
import { freePort } from '../helpers/ports.js';
import { prometheusPrograms, startPrometheus, type TestPrometheus } from '../helpers/prometheus.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import {
  call,
  directReplica,
  integrationDoc,
  startControlServer,
  startGatewayWith,
  type ControlServer,
  type ServiceDoc,
} from './integration-harness.js';

const RULES = join('docs', 'monitoring', 'dstack-proxy.rules.yml');
const DASHBOARD = join('docs', 'monitoring', 'dstack-proxy.dashboard.json');
const TOKEN = 'member-token-0123456789';

interface Rule {
  alert: string;
  expr: string;
  for?: string;
}

const rules = (): Rule[] => (parse(readFileSync(RULES, 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

/** Every query of the dashboard, with Grafana's variables as a scrape of one gateway sees them. */
function dashboardQueries(): { panel: string; expr: string }[] {
  const d = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { panels: { title: string; targets?: { expr: string }[] }[] };
  return d.panels.flatMap((p) =>
    (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr.replaceAll('$instance', '.*').replaceAll('$__rate_interval', '30s') })),
  );
}

/** The metric names an expression reads. */
function metricsOf(expr: string): string[] {
  return [...new Set(expr.match(/\bdstack_proxy_[a-z_]+/g) ?? [])];
}

let tmp: ReturnType<typeof tmpDir>;
let pebble: TestPebble;
let sshd: TestSshd;
let key: ClientKey;
let echo: Server;
let echoPort: number;
let control: ControlServer;
let t: TestGateway;
/** A gateway over a daemonised Nginx whose reload command always fails. */
let broken: TestGateway;
let ngDir: string;
let ngConf: string;
let prom: TestPrometheus;

const services = (acmeServer: string, extra: ServiceDoc[] = []): Record<string, unknown> =>
  integrationDoc({
    acmeServer,
    sshPrivateKey: key.privateKey,
    services: [
      { run: 'direct', domain: 'direct.gw.test', replicas: [directReplica('d0', echoPort)] },
      {
        run: 'tunnel',
        domain: 'tunnel.gw.test',
        replicas: [{ id: 't0', appPort: echoPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
      },
      { run: 'guarded', domain: 'guarded.gw.test', auth: true, replicas: [directReplica('g0', echoPort)] },
      { run: 'secure', domain: 'secure.gw.test', https: true, replicas: [directReplica('s0', echoPort)] },
      ...extra,
    ],
  });

beforeAll(async () => {
  tmp = tmpDir('dp-monitoring-');
  prometheusPrograms();
  pebble = await startPebble();
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  echoPort = await freePort();
  echo = await startEcho('app', { port: echoPort });
  control = await startControlServer({ main: [TOKEN] });
  t = await startGatewayWith(
    { acmeCaBundle: pebble.caPath, certbotTimeout: '60', serverUrl: control.url },
    // Test domains are not in DNS: the pre-flight resolves everything to loopback.
    { resolve: async () => ['127.0.0.1'] },
  );
  const r = await putState(t, services(pebble.directoryUrl));
  expect(r.status, r.body).toBe(200);
  ngDir = join(tmp.dir, 'nginx');
  const paths = await writeMainConf(ngDir, { user: 'root', workerProcesses: 1 });
  ngConf = paths.confPath;
  const ng = await execa('/usr/sbin/nginx', ['-p', ngDir, '-c', ngConf], { reject: false });
  expect(ng.exitCode, ng.stderr).toBe(0);
  broken = await startGatewayWith({
    nginx: 'system',
    sitesDir: paths.confDir,
    nginxConf: ngConf,
    reloadCommand: '/bin/false',
    testCommand: `/usr/sbin/nginx -t -q -p ${ngDir}`,
  });
  const b = await putState(
    broken,
    integrationDoc({ services: [{ run: 'site', domain: 'site.gw.test', replicas: [directReplica('x0', echoPort)] }] }),
  );
  expect(b.status, b.body).toBe(200);
  // The rules as shipped, with every `for:` at 0 s: an alert fires at the first evaluation that finds its cause.
  const now = readFileSync(RULES, 'utf8').replace(/^(\s+)for: .*$/gm, '$1for: 0s');
  prom = await startPrometheus(
    (dir) =>
      [
        'global:',
        '  scrape_interval: 1s',
        '  evaluation_interval: 1s',
        'rule_files:',
        `  - ${join(dir, 'rules.yml')}`,
        'scrape_configs:',
        '  - job_name: dstack-proxy',
        '    static_configs:',
        `      - targets: ['127.0.0.1:${t.apiPort}', '127.0.0.1:${broken.apiPort}']`,
        '',
      ].join('\n'),
    { 'rules.yml': now },
  );
}, 120_000);

afterAll(async () => {
  await prom?.stop();
  await t?.cleanup();
  await broken?.cleanup();
  if (ngConf) await execa('/usr/sbin/nginx', ['-s', 'stop', '-p', ngDir, '-c', ngConf], { reject: false });
  await control?.close().catch(() => undefined);
  await sshd?.stop();
  if (echo) await close(echo);
  await pebble?.destroy();
  tmp?.cleanup();
});

/** Requests through Nginx to every plain-HTTP service, a member's token on each. */
async function traffic(n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    for (const host of ['direct.gw.test', 'tunnel.gw.test', 'guarded.gw.test'])
      await call({ port: t.httpPort, host, headers: { authorization: `Bearer ${TOKEN}` } }).catch(() => undefined);
  }
}

/** The first gateway's alerts of that name, firing now (`of`: another gateway's). */
const firing = async (alert: string, of: TestGateway = t): Promise<Record<string, string>[]> =>
  (await prom.alerts())
    .filter((a) => a.labels.alertname === alert && a.state === 'firing' && a.labels.instance === `127.0.0.1:${of.apiPort}`)
    .map((a) => a.labels);

describe('docs/monitoring', () => {
  it('promtool accepts the alert rules', () => {
    const out = execFileSync(prometheusPrograms().promtool, ['check', 'rules', RULES], { encoding: 'utf8' });
    expect(out).toContain(`SUCCESS: ${rules().length} rules found`);
    expect(rules().length).toBeGreaterThanOrEqual(8);
  });

  it('every dashboard query returns data from a scraped gateway, and every metric an alert reads exists', async () => {
    // The certificate is issued, every service answers, and two scrapes hold the traffic.
    await eventually(
      async () => ((await prom.query('dstack_proxy_certificate_expiry_timestamp_seconds')).length > 0 ? true : undefined),
      90_000,
    );
    await eventually(async () => {
      await traffic(3);
      return (await prom.query(`sum(dstack_proxy_service_ready_replicas{instance="127.0.0.1:${t.apiPort}"})`))[0]?.value[1] === '4'
        ? true
        : undefined;
    }, 30_000);
    const empty: string[] = [];
    await eventually(async () => {
      await traffic(2);
      empty.length = 0;
      for (const q of dashboardQueries()) if ((await prom.query(q.expr)).length === 0) empty.push(`${q.panel}: ${q.expr}`);
      for (const r of rules())
        for (const m of metricsOf(r.expr)) if ((await prom.query(m)).length === 0) empty.push(`${r.alert} reads ${m}`);
      return empty.length === 0 ? true : undefined;
    }, 30_000).catch(() => undefined);
    expect(empty).toEqual([]);
    expect(dashboardQueries().length).toBeGreaterThanOrEqual(15);
    // Nothing is wrong with this gateway: none of its alerts fires (once the first reloads are behind).
    const firingNow = async (): Promise<string[]> =>
      (await prom.alerts())
        .filter((a) => a.state === 'firing' && a.labels.instance === `127.0.0.1:${t.apiPort}`)
        .map((a) => a.labels.alertname!);
    await eventually(async () => ((await firingNow()).length === 0 ? true : undefined), 30_000).catch(() => undefined);
    expect(await firingNow()).toEqual([]);
  }, 180_000);

  it('fires DstackProxyTunnelDown and DstackProxyNoReadyReplica when the replica host (sshd) dies', async () => {
    await sshd.stop();
    const down = await eventually(async () => {
      const a = await firing('DstackProxyTunnelDown');
      return a.length > 0 ? a : undefined;
    }, 60_000);
    expect(down[0]).toMatchObject({ service: 'main/tunnel', replica: 't0', severity: 'warning' });
    const none = await eventually(async () => {
      const a = await firing('DstackProxyNoReadyReplica');
      return a.length > 0 ? a : undefined;
    }, 30_000);
    expect(none.map((l) => `${l.project}/${l.run}`)).toEqual(['main/tunnel']);
  }, 120_000);

  it('fires DstackProxyCertificateFailing when the ACME server cannot be reached', async () => {
    const dead = `https://127.0.0.1:${await freePort()}/dir`;
    const r = await putState(
      t,
      services(dead, [{ run: 'late', domain: 'late.gw.test', https: true, replicas: [directReplica('l0', echoPort)] }]),
    );
    expect(r.status, r.body).toBe(200);
    const failing = await eventually(async () => {
      const a = await firing('DstackProxyCertificateFailing');
      return a.some((l) => l.domain === 'late.gw.test') ? a : undefined;
    }, 120_000);
    expect(failing.find((l) => l.domain === 'late.gw.test')).toMatchObject({ severity: 'warning' });
  }, 180_000);

  it('fires DstackProxyAuthServerUnreachable when the control server is gone', async () => {
    await control.close();
    // Tokens not seen before: no cached answer lets them through.
    const refused = await eventually(async () => {
      const r = await call({ port: t.httpPort, host: 'guarded.gw.test', headers: { authorization: `Bearer other-${Date.now()}` } });
      return (await firing('DstackProxyAuthServerUnreachable')).length > 0 ? r : undefined;
    }, 60_000);
    expect(refused.status).toBe(500);
  }, 120_000);

  it('fires DstackProxyNginxReloadFailing and DstackProxyNginxNotConverged when Nginx refuses reloads', async () => {
    for (const alert of ['DstackProxyNginxReloadFailing', 'DstackProxyNginxNotConverged']) {
      const a = await eventually(async () => {
        const f = await firing(alert, broken);
        return f.length > 0 ? f : undefined;
      }, 60_000);
      expect(a[0]!.severity).toMatch(/^(warning|critical)$/);
    }
  }, 120_000);
});
