// The options of a gateway adopted on a host that dstack provisioned, on the real private Nginx:
// - --access-log: the sites write it and the stats collector follows it through a rotation as
//   Ubuntu's logrotate does it (rename, then USR1 to the Nginx master, which reopens the path);
// - --certbot-config-dir: a valid certificate certbot already holds there (live/<domain>/, as
//   certbot lays it out) is served on HTTPS without an ACME request (--certbot-bin records
//   any call and fails);
// - --default-server false: the distribution's default site (a foreign file in the conf dir with
//   `listen … default_server`) answers unknown hosts, ours serve their domains and their ACME
//   challenges; our default server would clash with it (nginx -t refuses the same files);
// - dstack's own `00-log-format.conf` (a log_format dstack_stat, and a `set` of
//   $dstack_replica_hit) next to our files passes nginx -t.

import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildViews } from '../../src/reconcilers/nginx/view.js';
import { renderAll, renderGlobal } from '../../src/reconcilers/nginx/render.js';
import { testConfig, writeMainConf } from '../../src/reconcilers/nginx/nginx-process.js';
import { GLOBAL_FILE } from '../../src/reconcilers/nginx/names.js';
import { normalise } from '../../src/spec/index.js';
import type { ProxyStateInput } from '../../src/spec/input.js';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, directReplica, integrationDoc, sampleValue, scrape, startGatewayWith } from './integration-harness.js';

const COUNTED = 'counted.gw.test';
const ADOPTED = 'adopted.gw.test';
const UNKNOWN = 'unknown.gw.test';
const DISTRO_ANSWER = 'the distribution default site';

const tmp = tmpDir('dp-adopt-');
let echo: Server;
let echoPort: number;

beforeAll(async () => {
  echo = await startEcho('replica', { port: 0 });
  echoPort = (echo.address() as AddressInfo).port;
});

afterAll(async () => {
  if (echo) await close(echo);
  tmp.cleanup();
});

interface CollectRow {
  project_name: string;
  run_name: string;
  stats: Record<string, { requests: number }>;
}

/** Requests of main/<run> in the 300 s window of /api/stats/collect (the test takes far less). */
async function collected(t: TestGateway, run: string): Promise<number> {
  const r = await api(t, { path: '/api/stats/collect' });
  expect(r.status, r.body).toBe(200);
  return (r.json as CollectRow[]).find((s) => s.project_name === 'main' && s.run_name === run)?.stats['300']?.requests ?? 0;
}

async function requests(t: TestGateway, host: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) expect((await call({ port: t.httpPort, host, path: `/r/${i}` })).status).toBe(200);
}

describe('--access-log', () => {
  const logDir = join(tmp.dir, 'var-log-nginx');
  const log = join(logDir, 'dstack.access.log');
  let t: TestGateway;

  beforeAll(async () => {
    mkdirSync(logDir);
    t = await startGatewayWith({ accessLog: log });
    const doc = integrationDoc({ services: [{ run: 'counted', domain: COUNTED, replicas: [directReplica('counted-r0', echoPort)] }] });
    expect((await putState(t, doc)).status).toBe(200);
    await eventually(
      async () => ((await call({ port: t.httpPort, host: COUNTED, path: '/ready' })).status === 200 ? true : undefined),
      30_000,
    );
  }, 60_000);

  afterAll(async () => {
    await t?.cleanup();
  });

  it('is where the sites write and what /api/stats/collect counts', async () => {
    const before = await collected(t, 'counted');
    await requests(t, COUNTED, 5);
    await eventually(async () => ((await collected(t, 'counted')) === before + 5 ? true : undefined), 30_000);
    expect(readFileSync(log, 'utf8')).toContain(` ${COUNTED} 200 `);
    // Nothing goes to the default place any more.
    expect(existsSync(join(t.stateDir, 'logs', 'access.log'))).toBe(false);
  });

  it('is followed across a logrotate-style rotation (rename, USR1 to the master)', async () => {
    const before = await collected(t, 'counted');
    const rotationsBefore = sampleValue(await scrape(t), 'dstack_proxy_access_log_rotations_total') ?? 0;
    renameSync(log, `${log}.1`);
    const master = t.gw.nginx?.pid;
    expect(master).toBeGreaterThan(0);
    process.kill(master!, 'SIGUSR1');
    // The master reopens the path: a new, empty file.
    await eventually(() => (existsSync(log) ? true : undefined), 10_000);
    await requests(t, COUNTED, 4);
    await eventually(async () => ((await collected(t, 'counted')) === before + 4 ? true : undefined), 30_000);
    expect(readFileSync(log, 'utf8').trim().split('\n')).toHaveLength(4);
    expect(sampleValue(await scrape(t), 'dstack_proxy_access_log_rotations_total')).toBe(rotationsBefore + 1);
  });
});

/** A CA and a certificate for `domain` in `<configDir>` as certbot lays a lineage out. */
function certbotLineage(configDir: string, domain: string): { caPem: string } {
  const work = join(tmp.dir, 'openssl');
  mkdirSync(work, { recursive: true });
  const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: work, stdio: 'pipe' });
  ssl(
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '30',
    '-subj',
    '/CN=adoption test CA',
  );
  ssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'leaf.key', '-out', 'leaf.csr', '-subj', `/CN=${domain}`);
  writeFileSync(join(work, 'ext.cnf'), `subjectAltName=DNS:${domain}\n`);
  ssl(
    'x509',
    '-req',
    '-in',
    'leaf.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'leaf.pem',
    '-days',
    '90',
    '-extfile',
    'ext.cnf',
  );
  const leaf = readFileSync(join(work, 'leaf.pem'), 'utf8');
  const caPem = readFileSync(join(work, 'ca.pem'), 'utf8');
  const archive = join(configDir, 'archive', domain);
  const live = join(configDir, 'live', domain);
  mkdirSync(archive, { recursive: true });
  mkdirSync(live, { recursive: true });
  mkdirSync(join(configDir, 'renewal'), { recursive: true });
  writeFileSync(join(archive, 'cert1.pem'), leaf);
  writeFileSync(join(archive, 'chain1.pem'), caPem);
  writeFileSync(join(archive, 'fullchain1.pem'), leaf + caPem);
  writeFileSync(join(archive, 'privkey1.pem'), readFileSync(join(work, 'leaf.key')), { mode: 0o600 });
  for (const kind of ['cert', 'chain', 'fullchain', 'privkey'])
    symlinkSync(`../../archive/${domain}/${kind}1.pem`, join(live, `${kind}.pem`));
  writeFileSync(
    join(configDir, 'renewal', `${domain}.conf`),
    [
      'version = 2.9.0',
      `archive_dir = ${archive}`,
      `cert = ${live}/cert.pem`,
      `privkey = ${live}/privkey.pem`,
      `chain = ${live}/chain.pem`,
      `fullchain = ${live}/fullchain.pem`,
      '',
      '[renewalparams]',
      'authenticator = nginx',
      'server = https://acme-v02.api.letsencrypt.org/directory',
      '',
    ].join('\n'),
  );
  return { caPem };
}

describe('--certbot-config-dir', () => {
  const configDir = join(tmp.dir, 'etc-letsencrypt');
  const calls = join(tmp.dir, 'certbot-calls');
  let t: TestGateway;
  let caPem: string;

  beforeAll(async () => {
    ({ caPem } = certbotLineage(configDir, ADOPTED));
    const certbot = join(tmp.dir, 'certbot-that-fails');
    writeFileSync(certbot, `#!/bin/sh\necho "$@" >> '${calls}'\nexit 1\n`);
    chmodSync(certbot, 0o755);
    t = await startGatewayWith({ certbotConfigDir: configDir, certbotBin: certbot, dnsPreflight: 'false' });
    const doc = integrationDoc({
      services: [{ run: 'adopted', domain: ADOPTED, https: true, replicas: [directReplica('adopted-r0', echoPort)] }],
    });
    expect((await putState(t, doc)).status).toBe(200);
  }, 60_000);

  afterAll(async () => {
    await t?.cleanup();
  });

  it('serves the certificate certbot already holds there, without calling certbot', async () => {
    // Verified against the test CA for the domain's name: it is the adopted certificate.
    const r = await eventually(async () => {
      const reply = await call({ port: t.httpsPort, host: ADOPTED, path: '/tls', ca: caPem }).catch(() => undefined);
      return reply?.status === 200 ? reply : undefined;
    }, 30_000);
    expect(JSON.parse(r.body)).toMatchObject({ name: 'replica', url: '/tls' });
    // Plain HTTP redirects to it, as for a certificate of our own.
    expect((await call({ port: t.httpPort, host: ADOPTED, path: '/x' })).status).toBe(301);
    expect(existsSync(calls)).toBe(false);
    // certbot's lineage is left as it was.
    expect(readFileSync(join(configDir, 'live', ADOPTED, 'fullchain.pem'), 'utf8')).toContain('BEGIN CERTIFICATE');
  });
});

describe('--default-server false', () => {
  const sitesDir = join(tmp.dir, 'conf');
  let t: TestGateway;
  let ports: { apiPort: number; httpPort: number; httpsPort: number };

  /** Ubuntu's `default` site, on our HTTP port. */
  const distroDefault = (httpPort: number): string =>
    [
      'server {',
      `    listen 127.0.0.1:${httpPort} default_server;`,
      '    server_name _;',
      '    access_log off;',
      '    default_type text/plain;',
      `    return 200 "${DISTRO_ANSWER}\\n";`,
      '}',
      '',
    ].join('\n');

  beforeAll(async () => {
    const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
    ports = { apiPort, httpPort, httpsPort };
    mkdirSync(sitesDir, { recursive: true });
    writeFileSync(join(sitesDir, 'zz-default.conf'), distroDefault(httpPort));
    // The site needs our HTTP port before the start: the flags pick the ports, the handle says so.
    const started = await startGatewayWith({
      sitesDir,
      defaultServer: 'false',
      apiPort: String(apiPort),
      httpPort: String(httpPort),
      httpsPort: String(httpsPort),
    });
    t = { ...started, ...ports };
    const doc = integrationDoc({ services: [{ run: 'counted', domain: COUNTED, replicas: [directReplica('counted-r0', echoPort)] }] });
    expect((await putState(t, doc)).status).toBe(200);
    await eventually(
      async () => ((await call({ port: t.httpPort, host: COUNTED, path: '/ready' })).status === 200 ? true : undefined),
      30_000,
    );
  }, 60_000);

  afterAll(async () => {
    await t?.cleanup();
  });

  it("leaves unknown hosts to the distribution's default site; ours still serve", async () => {
    const unknown = await call({ port: t.httpPort, host: UNKNOWN, path: '/' });
    expect(unknown.status).toBe(200);
    expect(unknown.body).toBe(`${DISTRO_ANSWER}\n`);
    const ours = await call({ port: t.httpPort, host: COUNTED, path: '/ours' });
    expect(JSON.parse(ours.body)).toMatchObject({ name: 'replica', url: '/ours' });
    const global = readFileSync(join(sitesDir, GLOBAL_FILE), 'utf8');
    expect(global.split('\n').filter((l) => l.includes('default_server') && !l.includes('unix:'))).toEqual([]);
  });

  it("serves our domains' ACME challenges from their own sites", async () => {
    const webroot = t.gw.paths.acmeWebroot;
    const dir = join(webroot, '.well-known', 'acme-challenge');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'token-1'), 'token-1.key-authorization', { mode: 0o644 });
    const r = await call({ port: t.httpPort, host: COUNTED, path: '/.well-known/acme-challenge/token-1' });
    expect(r.status).toBe(200);
    expect(r.body).toBe('token-1.key-authorization');
    // An unknown host's challenge is the distribution's business.
    expect((await call({ port: t.httpPort, host: UNKNOWN, path: '/.well-known/acme-challenge/token-1' })).body).toBe(`${DISTRO_ANSWER}\n`);
  });

  it('is what lets the two coexist: our default server beside the same site fails nginx -t', async () => {
    const dir = join(tmp.dir, 'clash');
    const paths = await writeMainConf(dir, { confDir: join(dir, 'conf'), user: null });
    writeFileSync(join(paths.confDir, 'zz-default.conf'), distroDefault(ports.httpPort));
    const views = buildViews(normalise(integrationDoc({ services: [] }) as unknown as ProxyStateInput), {
      httpPort: ports.httpPort,
      httpsPort: ports.httpsPort,
      listenHost: '127.0.0.1',
      acmeWebroot: join(dir, 'acme'),
      accessLogPath: join(dir, 'access.log'),
    });
    writeFileSync(join(paths.confDir, GLOBAL_FILE), renderGlobal({ ...views.global, defaultServer: true }));
    const clash = await testConfig(paths.confPath, paths.prefix);
    expect(clash.ok).toBe(false);
    expect(JSON.stringify(clash)).toMatch(/duplicate default server/);
    writeFileSync(join(paths.confDir, GLOBAL_FILE), renderGlobal({ ...views.global, defaultServer: false }));
    expect(await testConfig(paths.confPath, paths.prefix)).toEqual({ ok: true });
  });
});

describe("dstack's 00-log-format.conf", () => {
  it('passes nginx -t next to our global file and a site', async () => {
    const dir = join(tmp.dir, 'dstack-log-format');
    const paths = await writeMainConf(dir, { confDir: join(dir, 'conf'), user: null });
    // What dstack's gateway leaves in sites-enabled.
    writeFileSync(
      join(paths.confDir, '00-log-format.conf'),
      [
        "log_format dstack_stat '$time_iso8601 $host $status $request_time $dstack_replica_hit';",
        '',
        'server {',
        `    listen unix:${join(dir, 'dstack-dummy-nginx.sock')};`,
        '    server_name placeholder.local;',
        '    deny all;',
        '    set $dstack_replica_hit 0;',
        '}',
        '',
      ].join('\n'),
    );
    const [httpPort, httpsPort] = (await freePorts(2)) as [number, number];
    const views = buildViews(
      normalise(
        integrationDoc({
          services: [{ run: 'counted', domain: COUNTED, replicas: [directReplica('counted-r0', echoPort)] }],
        }) as unknown as ProxyStateInput,
      ),
      { httpPort, httpsPort, listenHost: '127.0.0.1', acmeWebroot: join(dir, 'acme'), accessLogPath: join(dir, 'access.log') },
    );
    for (const [name, text] of renderAll(views)) writeFileSync(join(paths.confDir, name), text);
    expect(await testConfig(paths.confPath, paths.prefix)).toEqual({ ok: true });
  });
});
