// Keys as control servers and ssh-keygen write them: each format (OpenSSH, PKCS#1, PKCS#8, SEC1;
// RSA, ECDSA, Ed25519) is accepted by validation, and the replica behind a real sshd that
// authorises it becomes Connected and serves traffic — PKCS#8, as dstack's server generates its
// RSA keys, included, for project keys and for a jump host's own key. A key that cannot be used
// is refused at validation with its JSON path, and no part of it in the message.

import type { Server } from 'node:http';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { validate, type ProxyState } from '../../../src/spec/index.js';
import type { ProxyStateInput } from '../../../src/spec/input.js';
import { close, startEcho } from '../../helpers/http.js';
import { KEY_FORMATS, keyBody, keyInFormat, type KeyFormat } from '../../helpers/keys.js';
import { freePort } from '../../helpers/ports.js';
import { startSshd, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { echoName, startHarness, type Harness } from './harness.js';

let tmp: ReturnType<typeof tmpDir>;
let keys: Map<KeyFormat, { privateKey: string; publicKey: string }>;
let jumpKey: { privateKey: string; publicKey: string };
let sshd: TestSshd;
let jump: TestSshd;
let echo: Server;
let appPort: number;
let h: Harness | undefined;

const project = (f: KeyFormat): string => f.replace(/[^a-z0-9]/g, '');

function documentFor(formats: KeyFormat[], extra: ProxyStateInput['spec']['services'] = []): ProxyStateInput {
  return {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: formats.map((f) => ({ name: project(f), sshPrivateKey: keys.get(f)!.privateKey })),
      services: [
        ...formats.map((f) => ({
          project: project(f),
          run: 'app',
          https: false,
          auth: false,
          replicas: [{ id: `r-${project(f)}`, appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
        })),
        ...extra,
      ],
    },
  };
}

function valid(doc: ProxyStateInput): ProxyState {
  const r = validate(doc);
  if (!r.ok) throw new Error(`expected a valid document: ${JSON.stringify(r.errors)}`);
  return r.state;
}

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-keys-');
  keys = new Map(KEY_FORMATS.map((f) => [f, keyInFormat(tmp.dir, f)]));
  jumpKey = keyInFormat(tmp.dir, 'rsa-pkcs8');
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [...keys.values()].map((k) => k.publicKey) });
  jump = await startSshd({ dir: join(tmp.dir, 'jump'), authorizedKeys: [jumpKey.publicKey] });
  appPort = await freePort();
  echo = await startEcho('app', { port: appPort });
}, 60_000);

afterAll(async () => {
  await h?.close();
  await sshd?.stop();
  await jump?.stop();
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('private-key formats against a real sshd', () => {
  it('the test keys are in the formats they are named after', () => {
    const first = (f: KeyFormat): string => keys.get(f)!.privateKey.split('\n')[0]!;
    expect(first('rsa-pkcs8')).toBe('-----BEGIN PRIVATE KEY-----');
    expect(first('ecdsa-pkcs8')).toBe('-----BEGIN PRIVATE KEY-----');
    expect(first('ed25519-pkcs8')).toBe('-----BEGIN PRIVATE KEY-----');
    expect(first('rsa-pkcs1')).toBe('-----BEGIN RSA PRIVATE KEY-----');
    expect(first('ecdsa-sec1')).toBe('-----BEGIN EC PRIVATE KEY-----');
    for (const f of ['rsa-openssh', 'ecdsa-openssh', 'ed25519-openssh'] as const)
      expect(first(f)).toBe('-----BEGIN OPENSSH PRIVATE KEY-----');
  });

  it('every format validates, and its replica connects and serves', async () => {
    h = await startHarness(valid(documentFor(KEY_FORMATS)));
    for (const f of KEY_FORMATS) {
      await h.waitReason(`${project(f)}/app`, `r-${project(f)}`, 'Connected');
      const r = await h.get(`${project(f)}/app`);
      expect(r.status, f).toBe(200);
      expect(echoName(r)).toBe('app');
    }
  }, 120_000);

  it('a jump host with its own PKCS#8 key (and a PKCS#8 project key behind it) serves', async () => {
    expect(jumpKey.privateKey.startsWith('-----BEGIN PRIVATE KEY-----')).toBe(true);
    const doc = documentFor(
      ['rsa-pkcs8'],
      [
        {
          project: project('rsa-pkcs8'),
          run: 'jumped',
          https: false,
          auth: false,
          replicas: [
            {
              id: 'r-jumped',
              appPort,
              ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user },
              sshProxy: { host: '127.0.0.1', port: jump.port, user: jump.user, privateKey: jumpKey.privateKey },
            },
          ],
        },
      ],
    );
    await h!.put(valid(doc));
    await h!.waitReason(`${project('rsa-pkcs8')}/jumped`, 'r-jumped', 'Connected');
    expect(echoName(await h!.get(`${project('rsa-pkcs8')}/jumped`))).toBe('app');
    expect(jump.accepted()).toBeGreaterThan(0);
  }, 60_000);
});

describe('keys that cannot be used are refused at validation', () => {
  const refused = (): [string, () => string, RegExp][] => [
    ['an OpenSSH key with a passphrase', () => keyWithPassphrase('ed25519'), /encrypted with a passphrase/],
    ['an encrypted PKCS#8 key', () => encryptedPkcs8(), /encrypted with a passphrase/],
    ['a public key', () => keys.get('ed25519-openssh')!.publicKey, /is a public key/],
    ['a truncated key', () => keys.get('rsa-pkcs8')!.privateKey.slice(0, 400), /is not a private key in a format/],
    ['text that is no key', () => 'not a key at all', /is not a private key in a format/],
  ];

  it.each(refused())('%s, as a project key and as a hop key, with the path and no part of the key', (_name, make, message) => {
    const key = make();
    const doc = documentFor(['ed25519-openssh']);
    doc.spec.projects![0]!.sshPrivateKey = key;
    doc.spec.services![0]!.replicas![0]!.sshProxy = { host: '127.0.0.1', user: 'j', privateKey: key };
    const r = validate(doc);
    expect(r.ok).toBe(false);
    const errors = r.ok ? [] : r.errors;
    expect(errors).toEqual([
      { path: '/spec/projects/0/sshPrivateKey', message: expect.stringMatching(message) },
      { path: '/spec/services/0/replicas/0/sshProxy/privateKey', message: expect.stringMatching(message) },
    ]);
    const text = JSON.stringify(errors);
    for (const line of keyBody(key)) if (line.length >= 8) expect(text).not.toContain(line.slice(0, 16));
  });
});

function keyWithPassphrase(type: string): string {
  const file = join(tmp.dir, `enc-${type}`);
  execFileSync('ssh-keygen', ['-q', '-t', type, '-N', 'secret passphrase', '-f', file]);
  return readFileSync(file, 'utf8');
}

function encryptedPkcs8(): string {
  const file = join(tmp.dir, 'enc.pk8');
  execFileSync(
    'openssl',
    ['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-aes256', '-pass', 'pass:secret', '-out', file],
    { stdio: 'ignore' },
  );
  return readFileSync(file, 'utf8');
}
