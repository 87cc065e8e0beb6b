// Throwaway private keys for tests: valid keys (validation parses every key), never used for
// anything but tests. keyInFormat() makes a fresh key pair in each format a control server or
// ssh-keygen produces, for the tests that log in to a real sshd with it.

import { execFileSync } from 'node:child_process';
import { createPublicKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export const TEST_KEY_A = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACDWnOHE9SAq6W1r8Uc7K9CnM1bYtJ1e4VCzZb1xmD/lvwAAAJgB5ywjAecs
IwAAAAtzc2gtZWQyNTUxOQAAACDWnOHE9SAq6W1r8Uc7K9CnM1bYtJ1e4VCzZb1xmD/lvw
AAAEBnoO3r/LK9ZhHp5jy/hKTbL1TgoM2DVJGUBpc8B76Dgdac4cT1ICrpbWvxRzsr0Kcz
Vti0nV7hULNlvXGYP+W/AAAAE2RzdGFjay1wcm94eS10ZXN0LWEBAg==
-----END OPENSSH PRIVATE KEY-----
`;
export const TEST_KEY_B = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACBIQBy959hN5j6gt6GY0i+/yPljIkPuTaYR7iMaXeg+2wAAAJiQ1PpFkNT6
RQAAAAtzc2gtZWQyNTUxOQAAACBIQBy959hN5j6gt6GY0i+/yPljIkPuTaYR7iMaXeg+2w
AAAEDoejRYGP/5MD7GnpDbcqGiqQDy6LnBIXknYxHGbyQSJ0hAHL3n2E3mPqC3oZjSL7/I
+WMiQ+5NphHuIxpd6D7bAAAAE2RzdGFjay1wcm94eS10ZXN0LWIBAg==
-----END OPENSSH PRIVATE KEY-----
`;
export const TEST_KEY_C = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACAiACNGD9E7Zn5VYZs5f6GibswRI8m2YMFWYZjoKMcyRAAAAJjS94cn0veH
JwAAAAtzc2gtZWQyNTUxOQAAACAiACNGD9E7Zn5VYZs5f6GibswRI8m2YMFWYZjoKMcyRA
AAAEC3JAxREm73AJpzACY1dqLJLY0Z4XXrSUE7S4chJugfYCIAI0YP0TtmflVhmzl/oaJu
zBEjybZgwVZhmOgoxzJEAAAAE2RzdGFjay1wcm94eS10ZXN0LWMBAg==
-----END OPENSSH PRIVATE KEY-----
`;
export const TEST_KEY_D = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACC3UoitghDN2s8ADIal3zY+hrZWuYI0hBbCRcWXd3/4NAAAAJhJw/+qScP/
qgAAAAtzc2gtZWQyNTUxOQAAACC3UoitghDN2s8ADIal3zY+hrZWuYI0hBbCRcWXd3/4NA
AAAEBM/TVDpbtdOQFPxIgkazJIgGOMEo6svoJoKA/evbC9fbdSiK2CEM3azwAMhqXfNj6G
tla5gjSEFsJFxZd3f/g0AAAAE2RzdGFjay1wcm94eS10ZXN0LWQBAg==
-----END OPENSSH PRIVATE KEY-----
`;

/** The base64 body lines of a PEM key: what a leak of the key would show. */
export function keyBody(pem: string): string[] {
  return pem.split('\n').filter((l) => l && !l.startsWith('-----'));
}

export type KeyFormat =
  'rsa-openssh' | 'rsa-pkcs1' | 'rsa-pkcs8' | 'ecdsa-openssh' | 'ecdsa-sec1' | 'ecdsa-pkcs8' | 'ed25519-openssh' | 'ed25519-pkcs8';

export const KEY_FORMATS: KeyFormat[] = [
  'rsa-openssh',
  'rsa-pkcs1',
  'rsa-pkcs8',
  'ecdsa-openssh',
  'ecdsa-sec1',
  'ecdsa-pkcs8',
  'ed25519-openssh',
  'ed25519-pkcs8',
];

/**
 * A fresh key pair in `format` under `dir`: `ssh-keygen -m PEM/PKCS8` where it can, `openssl
 * genpkey` for PKCS#8 as dstack's server writes it (and for Ed25519, which ssh-keygen only
 * writes in OpenSSH's format). The public key comes from `ssh-keygen -y`, as an sshd takes it.
 */
export function keyInFormat(dir: string, format: KeyFormat): { privateKey: string; publicKey: string } {
  const file = join(dir, `client_${format}`);
  const keygen = (...args: string[]): void => void execFileSync('ssh-keygen', ['-q', '-N', '', '-C', format, '-f', file, ...args]);
  const openssl = (...args: string[]): void => void execFileSync('openssl', ['genpkey', ...args, '-out', file], { stdio: 'ignore' });
  switch (format) {
    case 'rsa-openssh':
      keygen('-t', 'rsa', '-b', '2048');
      break;
    case 'rsa-pkcs1':
      keygen('-t', 'rsa', '-b', '2048', '-m', 'PEM');
      break;
    case 'rsa-pkcs8':
      openssl('-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048');
      break;
    case 'ecdsa-openssh':
      keygen('-t', 'ecdsa', '-b', '384');
      break;
    case 'ecdsa-sec1':
      keygen('-t', 'ecdsa', '-b', '256', '-m', 'PEM');
      break;
    case 'ecdsa-pkcs8':
      keygen('-t', 'ecdsa', '-b', '521', '-m', 'PKCS8');
      break;
    case 'ed25519-openssh':
      keygen('-t', 'ed25519');
      break;
    case 'ed25519-pkcs8':
      openssl('-algorithm', 'ED25519');
      break;
  }
  const privateKey = readFileSync(file, 'utf8');
  // ssh-keygen -y cannot read an Ed25519 key in PKCS#8: its public half comes from Node.
  const publicKey =
    format === 'ed25519-pkcs8' ? ed25519AuthorizedKey(privateKey) : execFileSync('ssh-keygen', ['-y', '-f', file], { encoding: 'utf8' });
  return { privateKey, publicKey };
}

function ed25519AuthorizedKey(pem: string): string {
  const raw = createPublicKey(pem).export({ type: 'spki', format: 'der' }).subarray(-32);
  const field = (b: Buffer): Buffer => Buffer.concat([Buffer.from([0, 0, 0, b.length]), b]);
  return `ssh-ed25519 ${Buffer.concat([field(Buffer.from('ssh-ed25519')), field(raw)]).toString('base64')} ed25519-pkcs8\n`;
}
