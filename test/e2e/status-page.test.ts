// The status page (GET /status) in a real browser: headless Chromium opens it on a real gateway
// (its private Nginx, replicas direct and behind SSH, a certificate whose ACME server cannot be
// reached) with a healthy, a degraded and a failing service; the page shows each so, takes a
// screenshot, holds no secret, and redraws a change without being reloaded. The token path
// (Basic credentials a browser sends once asked) is checked over plain HTTP.

import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { startChromium, type TestBrowser, type TestPage } from '../helpers/chromium.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePort } from '../helpers/ports.js';
import { generateKey, type ClientKey } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { directReplica, integrationDoc, startGatewayWith, type ServiceDoc } from './integration-harness.js';

/** Where the screenshots go: the README's copy when asked for, else the test's own dir. */
const SHOTS = process.env.DSTACK_PROXY_SCREENSHOT_DIR;

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let echo: Server;
let echoPort: number;
let closedPort: number;
let t: TestGateway;
let browser: TestBrowser;
let page: TestPage;

/** A replica behind an SSH host nobody listens on: its tunnel never becomes Ready. */
const unreachable = (id: string) => ({ id, appPort: echoPort, ssh: { host: '127.0.0.1', port: closedPort, user: 'nobody' } });

const doc = (services: ServiceDoc[], acmePort: number): Record<string, unknown> =>
  integrationDoc({ acmeServer: `https://127.0.0.1:${acmePort}/dir`, sshPrivateKey: key.privateKey, services });

/** Built once the ports are known. */
const three = (): ServiceDoc[] => [
  { run: 'healthy', domain: 'healthy.gw.test', replicas: [directReplica('h0', echoPort), directReplica('h1', echoPort)] },
  { run: 'degraded', domain: 'degraded.gw.test', replicas: [directReplica('d0', echoPort), unreachable('d1')] },
  { run: 'failing', domain: 'failing.gw.test', replicas: [unreachable('f0')] },
  { run: 'secure', domain: 'secure.gw.test', https: true, replicas: [directReplica('s0', echoPort)] },
];
let acmePort: number;

/** Each service row's name and state, as the page shows them. */
const rows = (): Promise<Record<string, string>> =>
  page.evaluate(`Object.fromEntries([...document.querySelectorAll('tr[data-service]')].map((tr) => [tr.dataset.service, tr.className]))`);

beforeAll(async () => {
  tmp = tmpDir('dp-status-page-');
  key = generateKey(join(tmp.dir, 'project_ed25519'));
  echoPort = await freePort();
  echo = await startEcho('app', { port: echoPort });
  closedPort = await freePort();
  acmePort = await freePort();
  t = await startGatewayWith({ certbotTimeout: '20' }, { resolve: async () => ['127.0.0.1'] });
  const r = await putState(t, doc(three(), acmePort));
  expect(r.status, r.body).toBe(200);
  browser = await startChromium({ width: 1280, height: 900 });
  page = await browser.open(`http://127.0.0.1:${t.apiPort}/status`);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await t?.cleanup();
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('GET /status in Chromium', () => {
  it('shows a healthy, a degraded and a failing service, the certificate that fails, and the loops', async () => {
    const seen = await eventually(async () => {
      const r = await rows();
      return r['main/healthy'] === 'healthy' && r['main/degraded'] === 'degraded' && r['main/failing'] === 'failing' ? r : undefined;
    }, 60_000);
    expect(seen['main/secure']).toBe('healthy');
    const text = await eventually(async () => {
      const s = await page.evaluate<string>('document.body.innerText');
      return /secure\.gw\.test\s+failing/.test(s) ? s : undefined;
    }, 60_000);
    expect(text).toMatch(/d1\s+(Connecting|Unreachable|[A-Z]\w+)/);
    expect(text).toMatch(/nginx\s+(healthy|pending)/);
    expect(text).toMatch(/Nginx reloads \d+/);
    // What the page holds is what the status API answers: no key, no token.
    const html = await page.evaluate<string>('document.documentElement.outerHTML');
    expect(html).not.toContain('PRIVATE KEY');
    expect(html).not.toContain(key.privateKey.split('\n')[1]!);

    const dir = SHOTS ?? tmp.dir;
    if (!existsSync(dir)) mkdirSync(dir, { recursive: true });
    const shot = join(dir, 'status-page.png');
    await page.screenshot(shot);
    const png = readFileSync(shot);
    expect(png.subarray(1, 4).toString()).toBe('PNG');
    expect(png.length).toBeGreaterThan(10_000);
  }, 150_000);

  it('redraws a change without a reload of the page', async () => {
    await page.evaluate(`window.__sameDocument = true`);
    const started = performance.now();
    // The failing service goes, and a new healthy one comes.
    const next = [
      ...three().filter((s) => s.run !== 'failing'),
      { run: 'added', domain: 'added.gw.test', replicas: [directReplica('a0', echoPort)] },
    ];
    const r = await putState(t, doc(next, acmePort));
    expect(r.status, r.body).toBe(200);
    const after = await eventually(async () => {
      const s = await rows();
      return s['main/added'] === 'healthy' && s['main/failing'] === undefined ? s : undefined;
    }, 30_000);
    const ms = performance.now() - started;
    console.log(`the status page showed the change ${ms.toFixed(0)} ms after the PUT was sent`);
    expect(after['main/degraded']).toBe('degraded');
    expect(await page.evaluate('window.__sameDocument')).toBe(true);
  }, 60_000);
});
