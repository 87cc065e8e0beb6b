// A fleet of gateways on one PostgreSQL document shares its certificates: one gateway orders a
// domain's certificate under the domain's lock, stores it with its key in the database, and the
// others install it without calling the CA. Pebble really validates HTTP-01, through a front that
// sends each validation to a gateway that has not run certbot: the key authorization reaches it
// through the database. The first issuer is a gateway process killed with SIGKILL in the middle of
// its order (its certbot stops inside the auth hook): another gateway takes the lock and finishes.

import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import { connect, createServer, type Server as NetServer } from 'node:net';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { challengeHookPath } from '../../src/reconcilers/tls/certbot.js';
import { startCliGateway, type CliGateway } from '../helpers/cli-gateway.js';
import { api, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePort, freePorts } from '../helpers/ports.js';
import { startPebble, type TestPebble } from '../helpers/pebble.js';
import { createTestDatabase, type TestDatabase } from '../helpers/postgres.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, directReplica, integrationDoc, startGatewayWith } from './integration-harness.js';

const DOMAIN = 'fleet-tls.gw.test';
const tmp = tmpDir('dp-fleetcerts-');
let db: TestDatabase;
let pebble: TestPebble;
let front: NetServer;
let echo: Server;
let echoPort: number;
let first: CliGateway | undefined;
const fleet: TestGateway[] = [];
/** Where the front sent each of the CA's connections, and whether that gateway had run certbot. */
const validations: { gateway: number; hadRunCertbot: boolean }[] = [];
const certbotLog = (stateDir: string): string => join(stateDir, 'certbot', 'logs', 'letsencrypt.log');

beforeAll(async () => {
  db = await createTestDatabase('dp_fleetcerts');
  const frontPort = await freePort();
  pebble = await startPebble({ validateAt: frontPort });
  // Each of the CA's connections goes to a gateway of the fleet that has not run certbot: never
  // the one holding the key authorization in its webroot.
  let n = 0;
  front = createServer((client) => {
    const live = fleet.map((g, i) => ({ g, i }));
    const pick = live.find(({ g }) => !existsSync(certbotLog(g.stateDir))) ?? live[n++ % Math.max(1, live.length)];
    if (!pick) return void client.destroy();
    validations.push({ gateway: pick.i, hadRunCertbot: existsSync(certbotLog(pick.g.stateDir)) });
    const upstream = connect(pick.g.httpPort, '127.0.0.1');
    client.pipe(upstream).pipe(client);
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  await new Promise<void>((r) => front.listen(frontPort, '127.0.0.1', r));
  echoPort = await freePort();
  echo = await startEcho('fleet-tls', { port: echoPort });
}, 60_000);

afterAll(async () => {
  await first?.kill();
  // The killed gateway's certbot (its own process group, stopped in the hook) and private Nginx.
  const pidFile = join(tmp.dir, 'certbot.pid');
  const pid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) : 0;
  const wrapper = pid > 1 ? await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '') : '';
  if (wrapper.includes('certbot-stuck')) process.kill(-pid, 'SIGKILL');
  const nginxPid = Number(readFileSync(join(tmp.dir, 'first', 'nginx', 'nginx.pid'), 'utf8').trim() || 0);
  const title = nginxPid > 0 ? readFileSync(`/proc/${nginxPid}/cmdline`, 'utf8') : '';
  if (title.startsWith('nginx: master process')) process.kill(nginxPid, 'SIGTERM');
  for (const g of fleet) await g.cleanup();
  await new Promise((r) => front?.close(r));
  if (echo) await close(echo);
  await pebble?.destroy();
  await db?.drop();
  tmp.cleanup();
}, 60_000);

interface Condition {
  type: string;
  status: string;
  reason: string;
  message: string;
}

async function tlsConditions(port: number): Promise<Condition[]> {
  const s = (await api({ apiPort: port }, { path: '/api/v1/status' })).json as {
    loops: Record<string, { objects: Record<string, { conditions: Condition[] }> }>;
  };
  return s.loops.tls?.objects[DOMAIN]?.conditions ?? [];
}

/** The serial of the certificate presented for `domain` once it covers it; undefined before. */
function presentedSerial(httpsPort: number, domain: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const s = tlsConnect({ host: '127.0.0.1', port: httpsPort, servername: domain, rejectUnauthorized: false }, () => {
      const c = s.getPeerX509Certificate();
      s.end();
      resolve(c && c.checkHost(domain) !== undefined ? c.serialNumber.toUpperCase() : undefined);
    });
    s.on('error', () => resolve(undefined));
  });
}

/** certbot's orders for `domain` on a gateway, from its logs. */
function ordersFor(stateDir: string, domain: string): number {
  const logs = join(stateDir, 'certbot', 'logs');
  let n = 0;
  for (const f of existsSync(logs) ? readdirSync(logs) : []) {
    n += readFileSync(join(logs, f), 'utf8')
      .split('\n')
      .filter((l) => l.includes(`Requesting a certificate for ${domain}`)).length;
  }
  return n;
}

async function storedSerial(): Promise<string | null> {
  const c = new pg.Client({ connectionString: db.connectionString });
  await c.connect();
  try {
    const { rows } = await c.query<{ serial: string }>('SELECT serial FROM proxy_acme_certificates WHERE domain = $1', [DOMAIN]);
    return rows[0]?.serial ?? null;
  } finally {
    await c.end();
  }
}

const gatewayFlags = (): Record<string, string> => ({
  db: db.connectionString,
  acmeCaBundle: pebble.caPath,
  certbotTimeout: '120',
  dnsPreflight: 'false',
});

describe('gateways sharing their certificates through PostgreSQL', () => {
  it('finish an order whose gateway was killed in the middle of it, and all serve the one certificate', async () => {
    // The first gateway's certbot runs the real hook (the key authorization is stored), then stops there.
    const marker = join(tmp.dir, 'in-hook');
    const wrapper = join(tmp.dir, 'certbot-stuck.cjs');
    writeFileSync(
      wrapper,
      `#!${process.execPath}
const { spawnSync } = require('node:child_process');
require('node:fs').writeFileSync(${JSON.stringify(join(tmp.dir, 'certbot.pid'))}, String(process.pid));
const args = process.argv.slice(2);
const i = args.indexOf('--manual-auth-hook');
if (i >= 0) args[i + 1] += " && touch '${marker}' && sleep 600";
process.exit(spawnSync('certbot', args, { stdio: 'inherit' }).status ?? 1);
`,
    );
    chmodSync(wrapper, 0o755);
    const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
    first = await startCliGateway(
      join(tmp.dir, 'first'),
      { apiPort, httpPort, httpsPort },
      {
        args: ['--db', db.connectionString, '--certbot-bin', wrapper, '--acme-ca-bundle', pebble.caPath, '--dns-preflight', 'false'],
      },
    );
    const doc = integrationDoc({
      acmeServer: pebble.directoryUrl,
      services: [{ run: 'fleet-tls', domain: DOMAIN, https: true, replicas: [directReplica('r0', echoPort)] }],
    });
    const put = await api(first, { method: 'PUT', path: '/api/v1/state', body: doc });
    expect(put.status, put.body).toBe(200);
    await eventually(async () => (existsSync(marker) ? true : undefined), 60_000);

    // Two more gateways join while the first holds the domain's lock: neither orders.
    for (let i = 0; i < 2; i++) fleet.push(await startGatewayWith(gatewayFlags()));
    for (const g of fleet) {
      const issuing = await eventually(async () => {
        const c = (await tlsConditions(g.apiPort)).find((x) => x.type === 'Issuing');
        return c?.status === 'True' ? c : undefined;
      });
      expect(issuing.status).toBe('True');
      expect(existsSync(certbotLog(g.stateDir))).toBe(false);
    }

    // The first gateway dies mid-order: PostgreSQL drops its lock with its connection.
    await first.kill();
    const t0 = performance.now();
    const serials = await Promise.all(
      fleet.map((g) =>
        eventually(async () => {
          const ready = (await tlsConditions(g.apiPort)).find((x) => x.type === 'Ready');
          return ready?.status === 'True' ? presentedSerial(g.httpsPort, DOMAIN) : undefined;
        }, 120_000),
      ),
    );
    console.log(
      `fleet: a killed issuer's order finished by another gateway and served by both ${(performance.now() - t0).toFixed(0)} ms after the kill`,
    );
    expect(new Set(serials).size).toBe(1);
    expect(await storedSerial()).toBe(serials[0]);
    // One of the two ordered; the CA's validation reached the one that had not.
    expect(fleet.filter((g) => existsSync(certbotLog(g.stateDir)))).toHaveLength(1);
    expect(validations.length).toBeGreaterThanOrEqual(1);
    expect(validations.every((v) => !v.hadRunCertbot)).toBe(true);

    // A third gateway joins: it installs the stored certificate without calling the CA.
    fleet.push(await startGatewayWith(gatewayFlags()));
    const late = fleet[2]!;
    const lateSerial = await eventually(async () => presentedSerial(late.httpsPort, DOMAIN), 60_000);
    expect(lateSerial).toBe(serials[0]);
    expect(existsSync(certbotLog(late.stateDir))).toBe(false);
    // Served over HTTPS by every gateway, with a certificate the CA's root vouches for.
    const ca = await pebble.rootPem();
    for (const g of fleet) {
      // A connection right after a reload may still reach a worker of the config before it
      // (Nginx's Applied status is what waits that out): asked until the site answers.
      const r = await eventually(async () => {
        const x = await call({ port: g.httpsPort, host: DOMAIN, ca }).catch(() => null);
        return x?.status === 200 ? x : undefined;
      });
      expect(r.status, r.body).toBe(200);
    }
  }, 240_000);

  it('order a new domain once, whichever gateway the PUT reached, and all three serve it', async () => {
    const domain = `second.${DOMAIN}`;
    const doc = integrationDoc({
      acmeServer: pebble.directoryUrl,
      services: [
        { run: 'fleet-tls', domain: DOMAIN, https: true, replicas: [directReplica('r0', echoPort)] },
        { run: 'second', domain, https: true, replicas: [directReplica('r1', echoPort)] },
      ],
    });
    const put = await api(fleet[2]!, { method: 'PUT', path: '/api/v1/state', body: doc });
    expect(put.status, put.body).toBe(200);
    const serials = await Promise.all(fleet.map((g) => eventually(async () => presentedSerial(g.httpsPort, domain), 120_000)));
    expect(new Set(serials).size).toBe(1);
    // One ACME order for it in the whole fleet.
    const orders = fleet.map((g) => ordersFor(g.stateDir, domain));
    expect(
      orders.reduce((a, b) => a + b, 0),
      JSON.stringify(orders),
    ).toBe(1);
  }, 150_000);

  it('answers a key authorization stored by any gateway from every gateway', async () => {
    const token = 'tok_' + 'c'.repeat(40);
    const validation = `${token}.thumb_0123456789`;
    const webroot = join(tmp.dir, 'hook-webroot');
    const hook = spawnSync(process.execPath, [challengeHookPath(), 'auth'], {
      env: {
        ...process.env,
        DSTACK_PROXY_ACME_DB: db.connectionString,
        DSTACK_PROXY_ACME_WEBROOT: webroot,
        CERTBOT_TOKEN: token,
        CERTBOT_VALIDATION: validation,
      },
    });
    expect(hook.status, String(hook.stderr)).toBe(0);
    for (const g of fleet) {
      const r = await call({ port: g.httpPort, host: DOMAIN, path: `/.well-known/acme-challenge/${token}` });
      expect(r.status, r.body).toBe(200);
      expect(r.body).toBe(validation);
    }
    expect((await call({ port: fleet[0]!.httpPort, host: DOMAIN, path: '/.well-known/acme-challenge/tok_unknown' })).status).toBe(404);
  });

  it('never shows a private key: not in status, metrics or the killed gateway’s output', async () => {
    for (const g of fleet) {
      for (const path of ['/api/v1/status', '/metrics', '/api/v1/state']) {
        const r = await api(g, { path });
        expect(r.body).not.toMatch(/PRIVATE KEY/);
      }
    }
    expect(first!.stderr()).not.toMatch(/PRIVATE KEY/);
  });
});
