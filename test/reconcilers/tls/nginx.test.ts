// TLS loop + Nginx loop on one controller, as the gateway wires them: the site gets HTTPS once
// its certificate is Ready (chain verified against Pebble's root, no -k), HTTP redirects, and a
// renewal makes Nginx reload and serve the new serial.

import { join } from 'node:path';
import { connect } from 'node:tls';
import type { Server } from 'node:http';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeClock } from '../../helpers/fake-clock.js';
import { Controller } from '../../../src/reconcilers/controller.js';
import { createNginxLoop } from '../../../src/reconcilers/nginx/loop.js';
import { certificateOutputs } from '../../../src/reconcilers/outputs.js';
import { createTlsLoop, TLS_LOOP, type TlsLoop } from '../../../src/reconcilers/tls/index.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import { emptyState, type ProxyState } from '../../../src/spec/types.js';
import { close, request, startEcho } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { startPebble, type TestPebble } from '../../helpers/pebble.js';
import { freePort } from '../../helpers/ports.js';
import { tmpDir } from '../../helpers/tmp.js';
import { service } from '../nginx/fixtures.js';

const DOMAIN = 'web.gw.test';
let pebble: TestPebble;
let ng: TestNginx;
let echo: Server;
let tmp: ReturnType<typeof tmpDir>;
let tls: TlsLoop;
let controller: Controller;
let clock: FakeClock;
let state: ProxyState;

/** What the TLS loop publishes about DOMAIN. */
const cert = () => certificateOutputs(controller.statuses(), DOMAIN);

/** The serial of the certificate Nginx presents for DOMAIN, verified against `ca`. */
function servedSerial(ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: '127.0.0.1', port: ng.httpsPort, servername: DOMAIN, ca }, () => {
      const serial = s.getPeerCertificate().serialNumber.toUpperCase();
      s.end();
      resolve(serial);
    });
    s.on('error', reject);
  });
}

beforeAll(async () => {
  tmp = tmpDir('dp-tls-ng-');
  pebble = await startPebble();
  ng = await startTestNginx();
  const port = await freePort();
  echo = await startEcho('app', { port });
  state = emptyState();
  state.spec.acme = { server: pebble.directoryUrl };
  state.spec.projects = [{ name: 'main' }];
  state.spec.services = [
    service({ run: 'web', domain: DOMAIN, https: true, replicas: [{ id: 'r1', appPort: port, direct: { host: '127.0.0.1', port } }] }),
  ];
  clock = new FakeClock(Date.now());
  tls = createTlsLoop({
    stateDir: tmp.dir,
    acmeWebroot: ng.acmeWebroot,
    env: { REQUESTS_CA_BUNDLE: pebble.caPath },
    resolve: async () => ['127.0.0.1'],
  });
  const nginx = createNginxLoop({
    confDir: ng.paths.confDir,
    mainConfPath: ng.paths.confPath,
    test: ng.test,
    reload: ng.reload,
    view: { httpPort: ng.httpPort, httpsPort: ng.httpsPort, acmeWebroot: ng.acmeWebroot, accessLogPath: ng.accessLogPath },
    dependsOn: [TLS_LOOP],
  });
  controller = new Controller({
    loops: [tls, nginx] as unknown as AnyLoop[],
    getSpec: () => ({ state, generation: 1 }),
    clock,
    resyncIntervalMs: 365 * 24 * 3_600_000,
    logger: pino({ level: 'silent' }),
  });
  await controller.start();
  await controller.whenIdle();
}, 60_000);

afterAll(async () => {
  await controller?.stop();
  await ng?.stop();
  await pebble?.destroy();
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('TLS loop feeding the Nginx loop', () => {
  it('serves the issued certificate over HTTPS, and redirects HTTP', async () => {
    const root = await pebble.rootPem();
    expect(await servedSerial(root)).toBe(cert()?.serial);
    const res = await request({ port: ng.httpsPort, host: DOMAIN, ca: root });
    expect(res.status).toBe(200);
    const plain = await request({ port: ng.httpPort, host: DOMAIN, localAddress: '127.0.0.2' });
    expect(plain.status).toBe(301);
    expect(plain.headers.location).toBe(`https://${DOMAIN}:${ng.httpsPort}/`);
  });

  it('a renewal makes Nginx reload and serve the new serial', async () => {
    const root = await pebble.rootPem();
    const before = cert()!;
    clock.advance(Date.parse(before.renewalTime!) + 1_000 - clock.now());
    await controller.reconcileAll();
    await controller.whenIdle();
    const after = cert()!;
    expect(after.serial).not.toBe(before.serial);
    await eventually(async () => ((await servedSerial(root)) === after.serial ? true : undefined), 10_000);
    expect(after.certPath).toContain(join(tmp.dir, 'tls-certs', DOMAIN, after.serial!));
  });
});
