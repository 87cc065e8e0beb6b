// The TLS loop of a gateway in a fleet, against a certificate store standing in for the
// database (so it can be made to fail): a stored certificate is installed without certbot; one
// that does not match its key is not, and the domain is ordered again under its lock; while
// another gateway holds the lock nothing is ordered; and while the store does not answer the
// gateway serves what it has published and orders nothing.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Controller } from '../../../src/reconcilers/controller.js';
import { certificateOutputs } from '../../../src/reconcilers/outputs.js';
import { CertFiles } from '../../../src/reconcilers/tls/cert-files.js';
import { checkCertificate } from '../../../src/reconcilers/tls/certificate.js';
import { createTlsLoop, type TlsLoop } from '../../../src/reconcilers/tls/index.js';
import type { BackoffFile } from '../../../src/reconcilers/tls/backoff.js';
import type { SharedCertificates, StoredCertificate } from '../../../src/reconcilers/tls/shared.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import { emptyState } from '../../../src/spec/types.js';
import { FakeClock } from '../../helpers/fake-clock.js';

const DOMAIN = 'a.gw.test';
const scratch = mkdtempSync(join(tmpdir(), 'dp-tls-fleet-'));
let pair: { cert: string; key: string };
/** The same domain, valid for a year: what another gateway's renewal stores. */
let renewed: { cert: string; key: string };
let otherKey: string;
let n = 0;

beforeAll(async () => {
  const args = (name: string, days = 90): string[] => [
    ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'],
    ...['-keyout', `${name}.key`, '-out', `${name}.pem`, '-days', String(days), '-subj', `/CN=${DOMAIN}`],
    ...['-addext', `subjectAltName=DNS:${DOMAIN}`],
  ];
  await execa('openssl', args('a'), { cwd: scratch });
  await execa('openssl', args('b'), { cwd: scratch });
  await execa('openssl', args('c', 365), { cwd: scratch });
  const read = (name: string): { cert: string; key: string } => ({
    cert: readFileSync(join(scratch, `${name}.pem`), 'utf8'),
    key: readFileSync(join(scratch, `${name}.key`), 'utf8'),
  });
  pair = read('a');
  renewed = read('c');
  otherKey = readFileSync(join(scratch, 'b.key'), 'utf8');
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** An in-memory store; `down` makes every call fail as an unreachable database does. */
function memoryStore(): SharedCertificates & { certs: Map<string, StoredCertificate>; down: boolean; lockHeld: boolean } {
  let backoff: BackoffFile | null = null;
  const fail = (): never => {
    throw new Error('connect ECONNREFUSED 127.0.0.1:5432');
  };
  const s = {
    certs: new Map<string, StoredCertificate>(),
    down: false,
    lockHeld: false,
    async list() {
      if (s.down) fail();
      return new Map([...s.certs].map(([d, c]) => [d, { serial: c.serial, notBefore: c.notBefore, notAfter: c.notAfter }]));
    },
    async get(domain: string) {
      if (s.down) fail();
      return s.certs.get(domain) ?? null;
    },
    async put(c: StoredCertificate) {
      if (s.down) fail();
      s.certs.set(c.domain, c);
    },
    async lock() {
      if (s.down) fail();
      return s.lockHeld ? null : { release: async () => undefined };
    },
    challenge: async () => null,
    account: async () => null,
    saveAccount: async () => undefined,
    backoff: {
      read: async () => (s.down ? fail() : backoff && structuredClone(backoff)),
      change: async (mutate: (d: BackoffFile) => void) => {
        if (s.down) fail();
        const d = backoff ?? { version: 1 as const, domains: {}, orders: [] };
        mutate(d);
        backoff = d;
      },
    },
    hookEnv: () => ({}),
    onChange: () => undefined,
    close: async () => undefined,
  };
  return s;
}

function rig(
  shared: SharedCertificates,
  clock = new FakeClock(Date.now()),
): { loop: TlsLoop; controller: Controller; stateDir: string; ready: () => string | undefined } {
  const stateDir = join(scratch, `state-${++n}`);
  const loop = createTlsLoop({ stateDir, acmeWebroot: join(stateDir, 'acme'), certbotBin: '/bin/false', dnsPreflight: false, shared });
  const state = emptyState();
  state.spec.acme = { ...state.spec.acme, server: 'https://127.0.0.1:1/dir' };
  state.spec.entrypoints.push({ project: 'main', domain: DOMAIN, https: true });
  const controller = new Controller({
    loops: [loop as unknown as AnyLoop],
    getSpec: () => ({ state, generation: 1 }),
    clock,
    logger: pino({ level: 'silent' }),
  });
  const ready = (): string | undefined =>
    controller.statuses().loops.tls?.objects[DOMAIN]?.conditions.find((c) => c.type === 'Ready')?.reason;
  return { loop, controller, stateDir, ready };
}

function stored(keyPem: string, certPem = pair.cert): StoredCertificate {
  const check = checkCertificate(certPem, keyPem === otherKey ? pair.key : keyPem, DOMAIN, Date.now());
  if (!check.ok) throw new Error(check.message);
  return {
    domain: DOMAIN,
    serial: check.info.serial,
    notBefore: check.info.notBefore,
    notAfter: check.info.notAfter,
    certPem,
    keyPem,
    acmeKey: 'k',
  };
}

describe('the TLS loop of a gateway in a fleet', () => {
  it('installs a certificate another gateway stored, without running certbot', async () => {
    const shared = memoryStore();
    shared.certs.set(DOMAIN, stored(pair.key));
    const r = rig(shared);
    await r.controller.reconcileAll();
    expect(r.ready()).toBe('Issued');
    expect(r.loop.certbotRuns()).toBe(0);
    const out = certificateOutputs(r.controller.statuses(), DOMAIN);
    expect(readFileSync(out!.keyPath!, 'utf8')).toBe(pair.key);
    await r.controller.stop();
  });

  it('does not install a stored certificate whose key does not match: it orders anew', async () => {
    const shared = memoryStore();
    shared.certs.set(DOMAIN, stored(otherKey));
    const r = rig(shared);
    await r.controller.reconcileAll();
    expect(r.ready()).toBe('IssueFailed'); // certbot is /bin/false here
    expect(r.loop.certbotRuns()).toBe(1);
    expect(certificateOutputs(r.controller.statuses(), DOMAIN)?.keyPath ?? null).toBeNull();
    // The failure is the fleet's: another gateway sees the attempt in the shared backoff.
    expect((await shared.backoff.read())?.domains[DOMAIN]?.failedAttempts).toBe(1);
    await r.controller.stop();
  });

  it('orders nothing while another gateway holds the domain', async () => {
    const shared = memoryStore();
    shared.lockHeld = true;
    const r = rig(shared);
    await r.controller.reconcileAll();
    expect(r.loop.certbotRuns()).toBe(0);
    const issuing = r.controller.statuses().loops.tls?.objects[DOMAIN]?.conditions.find((c) => c.type === 'Issuing');
    expect(issuing?.status).toBe('True');
    await r.controller.stop();
  });

  it('leaves a renewal to the gateway holding the lock, and installs what it stores', async () => {
    const shared = memoryStore();
    shared.certs.set(DOMAIN, stored(pair.key));
    const clock = new FakeClock(Date.now());
    const r = rig(shared, clock);
    await r.controller.reconcileAll();
    expect(r.ready()).toBe('Issued');
    // Two thirds of the 90 days later it is due: another gateway holds the lock and renews.
    clock.advance(61 * 86_400_000);
    shared.lockHeld = true;
    await r.controller.reconcileAll();
    expect(r.loop.certbotRuns()).toBe(0);
    const issuing = r.controller.statuses().loops.tls?.objects[DOMAIN]?.conditions.find((c) => c.type === 'Issuing');
    expect(issuing?.status).toBe('True');
    // It stores the renewed certificate and lets the lock go: this gateway installs it, no order.
    const next = stored(renewed.key, renewed.cert);
    shared.certs.set(DOMAIN, next);
    shared.lockHeld = false;
    await r.controller.reconcileAll();
    expect(r.loop.certbotRuns()).toBe(0);
    expect(certificateOutputs(r.controller.statuses(), DOMAIN)?.serial).toBe(next.serial);
    await r.controller.stop();
  });

  it('serves what it has published, and orders nothing, while the store does not answer', async () => {
    const shared = memoryStore();
    const r = rig(shared);
    const c = stored(pair.key);
    await new CertFiles(join(r.stateDir, 'certbot', 'config'), join(r.stateDir, 'tls-certs'), true).publish(
      DOMAIN,
      c.serial,
      c.certPem,
      c.keyPem,
    );
    shared.down = true;
    await r.controller.reconcileAll();
    expect(r.ready()).toBe('Issued');
    expect(r.loop.certbotRuns()).toBe(0);
    expect(certificateOutputs(r.controller.statuses(), DOMAIN)?.serial).toBe(c.serial);
    await r.controller.stop();
  });
});
