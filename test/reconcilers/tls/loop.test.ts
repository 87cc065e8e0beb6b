// The TLS loop against real certbot and Pebble on 127.0.0.1, driven by the real controller on
// a FakeClock (certbot itself runs in real time).

import { X509Certificate } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeClock } from '../../helpers/fake-clock.js';
import type { Condition } from '../../../src/reconcilers/conditions.js';
import { Controller } from '../../../src/reconcilers/controller.js';
import { certFromTlsOutputs } from '../../../src/reconcilers/nginx/loop.js';
import { certificateOutputs, type CertificateOutputs } from '../../../src/reconcilers/outputs.js';
import { createTlsLoop, type TlsLoop } from '../../../src/reconcilers/tls/index.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import { emptyState, type Acme, type ProxyState } from '../../../src/spec/types.js';
import { startPebble, type TestPebble } from '../../helpers/pebble.js';

const MIN = 60_000;
const DAY = 24 * 60 * MIN;
const scratch = mkdtempSync(join(tmpdir(), 'dp-tls-loop-'));
let n = 0;

interface Rig {
  stateDir: string;
  clock: FakeClock;
  loop: TlsLoop;
  controller: Controller;
  logs: string[];
  state: ProxyState;
  cond(domain: string, type: 'Ready' | 'Issuing'): Condition | undefined;
  /** The domain's typed outputs, as Nginx and the metrics read them. */
  out(domain: string): CertificateOutputs | undefined;
}

function docFor(domains: string[], acme: Partial<Acme>): ProxyState {
  const state = emptyState();
  state.spec.acme = { ...state.spec.acme, ...acme };
  for (const domain of domains) state.spec.entrypoints.push({ project: 'main', domain, https: true });
  state.spec.entrypoints.push({ project: 'main', domain: 'plain.gw.test', https: false });
  return state;
}

function rig(o: {
  pebble: TestPebble;
  domains: string[];
  acme?: Partial<Acme>;
  stateDir?: string;
  clock?: FakeClock;
  resyncIntervalMs?: number;
}): Rig {
  const stateDir = o.stateDir ?? join(scratch, `state-${++n}`);
  const clock = o.clock ?? new FakeClock(Date.now());
  const logs: string[] = [];
  const logger = pino({ level: 'debug' }, { write: (s: string) => void logs.push(s) });
  const loop = createTlsLoop({
    stateDir,
    acmeWebroot: join(stateDir, 'acme'),
    env: { REQUESTS_CA_BUNDLE: o.pebble.caPath },
    resolve: async () => ['127.0.0.1'],
  });
  const state = docFor(o.domains, { server: o.pebble.directoryUrl, ...o.acme });
  const controller = new Controller({
    loops: [loop as unknown as AnyLoop],
    getSpec: () => ({ state, generation: 1 }),
    clock,
    logger,
    ...(o.resyncIntervalMs ? { resyncIntervalMs: o.resyncIntervalMs } : {}),
  });
  const cond = (domain: string, type: 'Ready' | 'Issuing') =>
    controller.statuses().loops.tls?.objects[domain]?.conditions.find((c) => c.type === type);
  const out = (domain: string) => certificateOutputs(controller.statuses(), domain);
  return { stateDir, clock, loop, controller, logs, state, cond, out };
}

/** The published certificate of a Ready domain, checked against Pebble's root. */
async function servedCert(r: Rig, pebble: TestPebble, domain: string): Promise<X509Certificate> {
  const paths = certFromTlsOutputs(domain, r.controller.statuses());
  expect(paths).not.toBeNull();
  const pem = readFileSync(paths!.certPath, 'utf8');
  const [leafPem, interPem] = pem.split(/(?<=-----END CERTIFICATE-----)\s*/).filter((p) => p.includes('BEGIN'));
  const leaf = new X509Certificate(leafPem!);
  const inter = new X509Certificate(interPem!);
  const root = new X509Certificate(await pebble.rootPem());
  expect(leaf.checkHost(domain)).toBe(domain);
  expect(leaf.verify(inter.publicKey)).toBe(true);
  expect(inter.verify(root.publicKey)).toBe(true);
  expect(statSync(paths!.keyPath).mode & 0o777).toBe(0o600);
  return leaf;
}

let pebble: TestPebble;
beforeAll(async () => {
  pebble = await startPebble();
}, 30_000);
afterAll(async () => {
  await pebble?.destroy();
  rmSync(scratch, { recursive: true, force: true });
});

describe('TLS loop with certbot and Pebble', () => {
  it('issues a certificate per https domain; removing the domain stops serving it', async () => {
    const r = rig({ pebble, domains: ['svc1.gw.test'] });
    await r.controller.start();
    expect(r.cond('svc1.gw.test', 'Ready')).toMatchObject({ status: 'True', reason: 'Issued' });
    expect(r.cond('svc1.gw.test', 'Issuing')).toMatchObject({ status: 'False', reason: 'Idle' });
    expect(r.cond('plain.gw.test', 'Ready')).toBeUndefined();
    const leaf = await servedCert(r, pebble, 'svc1.gw.test');
    const out = r.out('svc1.gw.test');
    expect(out?.serial).toBe(leaf.serialNumber.toUpperCase());
    expect(out?.notAfter).toBe(new Date(leaf.validTo).toISOString());
    expect(r.cond('svc1.gw.test', 'Ready')?.message).toBe(
      `serial ${out!.serial}; notAfter ${out!.notAfter}; renewalTime ${out!.renewalTime}`,
    );
    expect(statSync(join(r.stateDir, 'certbot', 'config')).mode & 0o077).toBe(0);
    const issued = r.logs
      .map((l) => JSON.parse(l) as { msg: string; durationMs?: number })
      .find((l) => l.msg === 'certificate for svc1.gw.test issued');
    expect(issued?.durationMs).toBeGreaterThan(0);

    // A second pass changes nothing and runs no certbot.
    await r.controller.reconcileAll();
    expect(r.loop.certbotRuns()).toBe(1);
    expect(await r.controller.dryRun(r.state)).toEqual({ tls: [] });

    r.state.spec.entrypoints = r.state.spec.entrypoints.filter((e) => e.domain !== 'svc1.gw.test');
    await r.controller.reconcileAll();
    expect(r.cond('svc1.gw.test', 'Ready')).toBeUndefined();
    expect(r.out('svc1.gw.test')).toBeUndefined();
    expect(existsSync(join(r.stateDir, 'tls-certs', 'svc1.gw.test'))).toBe(false);
    await r.controller.stop();
  }, 60_000);

  it('renews once two thirds of the lifetime have passed: new serial, new paths for Nginx', async () => {
    const r = rig({ pebble, domains: ['renew.gw.test'], resyncIntervalMs: 365 * DAY });
    await r.controller.start();
    const first = r.out('renew.gw.test')!;
    const pathsBefore = certFromTlsOutputs('renew.gw.test', r.controller.statuses());

    r.clock.advance(Date.parse(first.renewalTime!) - 60_000 - r.clock.now()); // a minute before: nothing to do
    await r.controller.reconcileAll();
    expect(r.loop.certbotRuns()).toBe(1);
    const plan = await r.controller.dryRun(r.state);
    expect(plan.tls).toEqual([]);

    r.clock.advance(2 * 60_000); // past 2/3
    expect((await r.controller.dryRun(r.state)).tls?.map((a) => a.kind)).toEqual(['renew']);
    await r.controller.reconcileAll();
    await r.controller.whenIdle();
    expect(r.loop.certbotRuns()).toBe(2);
    const second = r.out('renew.gw.test')!;
    expect(second.serial).not.toBe(first.serial);
    expect(r.cond('renew.gw.test', 'Ready')).toMatchObject({
      status: 'True',
      message: expect.stringContaining(`serial ${second.serial};`),
    });
    const pathsAfter = certFromTlsOutputs('renew.gw.test', r.controller.statuses());
    expect(pathsAfter).not.toEqual(pathsBefore);
    expect((await servedCert(r, pebble, 'renew.gw.test')).serialNumber.toUpperCase()).toBe(second.serial);
    await r.controller.stop();
  }, 60_000);
});

describe('TLS loop when the ACME server is down', () => {
  let down: TestPebble;
  beforeAll(async () => {
    down = await startPebble();
    await down.stop();
  }, 30_000);
  afterAll(async () => down?.destroy());

  it('follows the schedule, never exceeds the limits, and issues on the next allowed attempt once it is back', async () => {
    const r = rig({ pebble: down, domains: ['flaky.gw.test'] });
    const t0 = r.clock.now();
    const attempts: number[] = [];
    let runs = 0;
    const note = (): void => {
      for (; runs < r.loop.certbotRuns(); runs++) attempts.push((r.clock.now() - t0) / MIN);
    };
    await r.controller.start();
    note();
    const ready = r.cond('flaky.gw.test', 'Ready');
    expect(ready).toMatchObject({ status: 'False', reason: 'IssueFailed' });
    expect(ready?.message).toMatch(/^failedAttempts 1; lastFailureTime \S+; nextAttemptTime \S+; error .*Connection refused/);
    expect(ready?.message).not.toMatch(/Traceback|Ask for help|Saving debug log/);

    // Every fake minute for just under four hours; Pebble comes back after the sixth attempt.
    for (let minute = 1; minute <= 235 && r.cond('flaky.gw.test', 'Ready')?.status !== 'True'; minute++) {
      r.clock.advance(MIN);
      await r.controller.whenIdle();
      note();
      if (minute === 115) {
        expect(r.out('flaky.gw.test')).toMatchObject({ failedAttempts: 6, nextAttemptTime: new Date(t0 + 231 * MIN).toISOString() });
        await down.start();
      }
    }
    expect(attempts).toEqual([0, 1, 6, 21, 51, 111, 231]);
    for (const a of attempts) expect(attempts.filter((b) => b >= a && b < a + 60).length).toBeLessThanOrEqual(5);
    expect(r.cond('flaky.gw.test', 'Ready')).toMatchObject({ status: 'True', reason: 'Issued' });
    expect(r.out('flaky.gw.test')?.failedAttempts).toBe(0);
    await r.controller.stop();
    await down.stop();
  }, 180_000);

  it('a restart during backoff continues the schedule', async () => {
    const a = rig({ pebble: down, domains: ['again.gw.test'] });
    const t0 = a.clock.now();
    await a.controller.start();
    a.clock.advance(MIN);
    await a.controller.whenIdle();
    expect(a.loop.certbotRuns()).toBe(2);
    await a.controller.stop();

    const b = rig({ pebble: down, domains: ['again.gw.test'], stateDir: a.stateDir, clock: a.clock });
    a.clock.advance(MIN);
    await b.controller.start();
    expect(b.loop.certbotRuns()).toBe(0);
    expect(b.cond('again.gw.test', 'Ready')?.message).toContain(
      `failedAttempts 2; lastFailureTime ${new Date(t0 + MIN).toISOString()}; nextAttemptTime ${new Date(t0 + 6 * MIN).toISOString()}`,
    );
    const plan = await b.controller.dryRun(b.state);
    expect(plan.tls?.[0]?.summary).toContain(
      `next attempt at ${new Date(t0 + 6 * MIN).toISOString()}; backoff allows 3 attempt(s) in the next hour`,
    );
    for (let i = 0; i < 3; i++) {
      b.clock.advance(MIN);
      await b.controller.whenIdle();
    }
    expect(b.loop.certbotRuns()).toBe(0); // t0 + 5 min
    b.clock.advance(MIN);
    await b.controller.whenIdle();
    expect(b.loop.certbotRuns()).toBe(1); // t0 + 6 min
    expect(b.out('again.gw.test')?.failedAttempts).toBe(3);
    await b.controller.stop();
  }, 60_000);

  it('a domain that does not resolve is DNSNotReady and spends no attempt', async () => {
    const stateDir = join(scratch, 'dns');
    const loop = createTlsLoop({
      stateDir,
      acmeWebroot: join(stateDir, 'acme'),
      resolve: async () => Promise.reject(Object.assign(new Error('nx'), { code: 'ENOTFOUND' })),
    });
    const state = docFor(['nowhere.gw.test'], { server: down.directoryUrl });
    const controller = new Controller({
      loops: [loop as unknown as AnyLoop],
      getSpec: () => ({ state, generation: 1 }),
      clock: new FakeClock(Date.now()),
    });
    await controller.start();
    await controller.stop();
    expect(loop.certbotRuns()).toBe(0);
    const ready = controller.statuses().loops.tls?.objects['nowhere.gw.test']?.conditions.find((c) => c.type === 'Ready');
    expect(ready).toMatchObject({ status: 'False', reason: 'DNSNotReady' });
    expect(ready?.message).toContain('failedAttempts 0');
    expect(ready?.message).toContain('nowhere.gw.test does not resolve (ENOTFOUND)');
  });
});

describe('TLS loop with many domains whose DNS is not there yet', () => {
  it('a pass writes tls-backoff.json once, not once per domain, and the next process reads it back', async () => {
    const stateDir = join(scratch, 'dns-many');
    const domains = Array.from({ length: 60 }, (_, i) => `s${i}.bulk.test`);
    const nx = async () => Promise.reject(Object.assign(new Error('nx'), { code: 'ENOTFOUND' }));
    // Nothing listens on the ACME address: no request may leave (none is made: DNS fails first).
    const state = docFor(domains, { server: 'https://127.0.0.1:9/dir' });
    const clock = new FakeClock(Date.now());
    const loop = createTlsLoop({ stateDir, acmeWebroot: join(stateDir, 'acme'), resolve: nx });
    const controller = new Controller({ loops: [loop as unknown as AnyLoop], getSpec: () => ({ state, generation: 1 }), clock });
    await controller.start();
    expect(loop.backoffWrites()).toBe(1);
    expect(loop.certbotRuns()).toBe(0);
    // The DNS re-checks 30 s later are one more pass: one more write.
    clock.advance(30_000);
    await controller.whenIdle();
    expect(loop.backoffWrites()).toBe(2);
    await controller.stop();
    const onDisk = JSON.parse(readFileSync(join(stateDir, 'tls-backoff.json'), 'utf8')) as {
      domains: Record<string, { lastReason?: string }>;
    };
    expect(Object.keys(onDisk.domains).sort()).toEqual([...domains].sort());
    expect(Object.values(onDisk.domains).every((e) => e.lastReason === 'DNSNotReady')).toBe(true);

    const again = createTlsLoop({ stateDir, acmeWebroot: join(stateDir, 'acme'), resolve: nx });
    const c2 = new Controller({ loops: [again as unknown as AnyLoop], getSpec: () => ({ state, generation: 1 }), clock });
    await c2.start();
    // Still within the 30 s of the last check: nothing to write, every domain reported.
    expect(again.backoffWrites()).toBe(0);
    expect(Object.keys(c2.statuses().loops.tls?.objects ?? {}).length).toBe(domains.length);
    await c2.stop();
  });
});

describe('TLS loop with EAB', () => {
  const kid = 'kid-1';
  const hmac = 'zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W';
  let eab: TestPebble;
  beforeAll(async () => {
    eab = await startPebble({ eab: { [kid]: hmac } });
  }, 30_000);
  afterAll(async () => eab?.destroy());

  /** Every file under `dir`, read as text. */
  function allText(dir: string): string {
    if (!existsSync(dir)) return '';
    return readdirSync(dir, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => readFileSync(join(e.parentPath, e.name), 'utf8'))
      .join('\n');
  }

  it('issues with the document kid/HMAC key, which appears in no log, status, plan or file', async () => {
    const r = rig({ pebble: eab, domains: ['eab.gw.test'], acme: { eabKid: kid, eabHmacKey: hmac, email: 'ops@example.com' } });
    const plan = await r.controller.dryRun(r.state);
    expect(plan.tls?.map((a) => a.kind)).toEqual(['issue']);
    await r.controller.start();
    expect(r.cond('eab.gw.test', 'Ready')).toMatchObject({ status: 'True' });
    await servedCert(r, eab, 'eab.gw.test');
    for (const text of [JSON.stringify(plan), JSON.stringify(r.controller.statuses()), r.logs.join('\n'), allText(r.stateDir)]) {
      expect(text).not.toContain(hmac);
    }
    await r.controller.stop();
  }, 60_000);

  it('fails cleanly without them', async () => {
    const r = rig({ pebble: eab, domains: ['noeab.gw.test'] });
    await r.controller.start();
    const ready = r.cond('noeab.gw.test', 'Ready');
    expect(ready).toMatchObject({ status: 'False', reason: 'IssueFailed' });
    expect(ready?.message).toContain('error Unable to register an account with ACME server. Server requires external account binding.');
    expect(r.cond('noeab.gw.test', 'Issuing')).toMatchObject({ status: 'False', reason: 'BackingOff' });
    await r.controller.stop();
  }, 60_000);
});
