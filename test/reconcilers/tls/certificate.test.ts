import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorLine, scrub, secret } from '../../../src/reconcilers/tls/certbot.js';
import { checkCertificate, readCertificate } from '../../../src/reconcilers/tls/certificate.js';
import { needsIssuing } from '../../../src/reconcilers/tls/policies.js';
import { certificateOutputsOf, domainConditions } from '../../../src/reconcilers/tls/status.js';
import { certFromTlsOutputs } from '../../../src/reconcilers/nginx/loop.js';
import type { Outputs, StatusSnapshot } from '../../../src/reconcilers/types.js';

let dir: string;
let cert: string;
let key: string;
let otherKey: string;

async function selfSigned(name: string, days: number): Promise<{ cert: string; key: string }> {
  await execa(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      `${name}.key`,
      '-out',
      `${name}.pem`,
      '-days',
      String(days),
      '-subj',
      '/CN=a.gw.test',
      '-addext',
      'subjectAltName=DNS:a.gw.test',
    ],
    { cwd: dir },
  );
  return { cert: readFileSync(join(dir, `${name}.pem`), 'utf8'), key: readFileSync(join(dir, `${name}.key`), 'utf8') };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'dp-tls-cert-'));
  ({ cert, key } = await selfSigned('a', 90));
  ({ key: otherKey } = await selfSigned('b', 90));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('checkCertificate', () => {
  it('accepts a certificate that covers the domain, matches its key and has not expired', () => {
    const r = checkCertificate(cert, key, 'a.gw.test', Date.now());
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const life = r.info.notAfter - r.info.notBefore;
    expect(r.info.renewalTime - r.info.notBefore).toBe(Math.floor((life * 2) / 3));
    expect(r.info.serial).toMatch(/^[0-9A-F]+$/);
  });

  it.each([
    ['another domain', () => checkCertificate(cert, key, 'b.gw.test', Date.now()), 'does not cover b.gw.test'],
    ['a key that does not match', () => checkCertificate(cert, otherKey, 'a.gw.test', Date.now()), 'does not match'],
    ['garbage', () => checkCertificate('nope', key, 'a.gw.test', Date.now()), 'does not parse'],
    ['an expired certificate', () => checkCertificate(cert, key, 'a.gw.test', Date.now() + 91 * 86_400_000), 'expired'],
  ])('rejects %s', (_name, run, text) => {
    const r = run();
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.message).toContain(text);
  });

  it('a missing file is Missing; renewal is due after two thirds of the lifetime', async () => {
    expect(await readCertificate(join(dir, 'none.pem'), join(dir, 'none.key'), 'a.gw.test', Date.now())).toMatchObject({
      ok: false,
      reason: 'Missing',
    });
    writeFileSync(join(dir, 'c.pem'), cert);
    const r = await readCertificate(join(dir, 'c.pem'), join(dir, 'a.key'), 'a.gw.test', Date.now());
    if (!r.ok) throw new Error(r.message);
    expect(needsIssuing(r, r.info.renewalTime - 1)).toBeNull();
    expect(needsIssuing(r, r.info.renewalTime)).toMatchObject({ reason: 'RenewalDue' });
  });
});

describe('certbot output', () => {
  it('one readable line without boilerplate, secrets scrubbed', () => {
    const out = [
      'Saving debug log to /x/letsencrypt.log',
      'An unexpected error occurred:',
      'ValueError: Requesting 127.0.0.1/dir: Connection refused',
      'Ask for help or search for solutions at https://community.letsencrypt.org. See the logfile /x/l.log or re-run Certbot with -v for more details.',
    ].join('\n');
    expect(errorLine(out)).toBe('An unexpected error occurred: ValueError: Requesting 127.0.0.1/dir: Connection refused');
    expect(scrub('key s3cr3t in s3cr3t', ['s3cr3t'])).toBe('key <redacted> in <redacted>');
  });

  it('a Secret never serialises', () => {
    const s = secret('hmac-value');
    expect(JSON.stringify({ s })).toBe('{"s":"<redacted>"}');
    expect(String(s)).toBe('<redacted>');
    expect(s.reveal()).toBe('hmac-value');
  });
});

describe('certificate outputs, as Nginx reads them', () => {
  const snapshot = (status: 'True' | 'False', message: string, outputs: Outputs): StatusSnapshot => ({
    generation: 1,
    loops: {
      tls: {
        conditions: [],
        failures: {},
        objects: {
          'a.gw.test': { conditions: [{ type: 'Ready', status, reason: 'Issued', message, lastTransitionTime: new Date(0) }], outputs },
        },
      },
    },
  });

  it('a Ready domain → its published paths, which change with the serial', () => {
    const info = {
      domain: 'a.gw.test',
      cert: { serial: 'AB01', notBefore: 0, notAfter: 3000, renewalTime: 2000 },
      issuing: false,
      failedAttempts: 0,
    };
    const msg = domainConditions(info).ready.message;
    const outputs = certificateOutputsOf(info, '/s/certs');
    expect(outputs).toEqual({
      serial: 'AB01',
      certPath: '/s/certs/a.gw.test/AB01/fullchain.pem',
      keyPath: '/s/certs/a.gw.test/AB01/privkey.pem',
      notAfter: new Date(3000).toISOString(),
      renewalTime: new Date(2000).toISOString(),
      failedAttempts: 0,
      nextAttemptTime: null,
      lastError: null,
    });
    // The message still says it for people; nothing reads it back.
    expect(msg).toBe(`serial AB01; notAfter ${new Date(3000).toISOString()}; renewalTime ${new Date(2000).toISOString()}`);
    expect(certFromTlsOutputs('a.gw.test', snapshot('True', msg, outputs))).toEqual({
      certPath: '/s/certs/a.gw.test/AB01/fullchain.pem',
      keyPath: '/s/certs/a.gw.test/AB01/privkey.pem',
    });
    const renewed = certificateOutputsOf({ ...info, cert: { ...info.cert, serial: 'AB02' } }, '/s/certs');
    expect(certFromTlsOutputs('a.gw.test', snapshot('True', msg, renewed))?.certPath).toBe('/s/certs/a.gw.test/AB02/fullchain.pem');
    expect(certFromTlsOutputs('a.gw.test', snapshot('False', msg, outputs))).toBeNull();
    expect(certFromTlsOutputs('b.gw.test', snapshot('True', msg, outputs))).toBeNull();
    expect(certFromTlsOutputs('a.gw.test', { generation: 1, loops: {} })).toBeNull();
  });

  it('no certificate served → null paths, whatever the message says', () => {
    const info = {
      domain: 'a.gw.test',
      cert: null,
      issuing: false,
      failedAttempts: 2,
      nextAttemptTime: 5000,
      lastError: 'urn:acme:error:rejected',
    };
    const outputs = certificateOutputsOf(info, '/s/certs');
    expect(outputs).toMatchObject({
      serial: null,
      certPath: null,
      keyPath: null,
      notAfter: null,
      failedAttempts: 2,
      nextAttemptTime: new Date(5000).toISOString(),
      lastError: 'urn:acme:error:rejected',
    });
    expect(certFromTlsOutputs('a.gw.test', snapshot('True', 'serial AB01; notAfter x; renewalTime y', outputs))).toBeNull();
  });
});
