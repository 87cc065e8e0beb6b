// Private keys as control servers and ssh-keygen write them, made usable by ssh2. ssh2 reads
// OpenSSH, PKCS#1 (RSA) and SEC1 (EC) PEM, but not PKCS#8 (`BEGIN PRIVATE KEY`), which is how
// dstack's server generates its RSA keys: those are converted once, by Node's crypto, to the
// form ssh2 reads (PKCS#1, SEC1, or OpenSSH for Ed25519, which has no other PEM form ssh2
// takes). A key nothing can read, or one locked with a passphrase, is a validation error.
// Messages never contain any part of the key.

import { createHash, createPrivateKey, type KeyObject } from 'node:crypto';
import { parseKey } from '../ssh2.js';

export type UsableKey = { ok: true; key: string; type: string } | { ok: false; problem: string };

/** Distinct keys remembered; a document has one per project or hop, not one per service. */
const CACHE_LIMIT = 1024;
const cache = new Map<string, UsableKey>();

/**
 * The key in a form ssh2 reads, or why it cannot be used. Cached by a hash of the text, so a
 * document whose 10,000 replicas share a few keys parses each of them once.
 */
export function usablePrivateKey(text: string): UsableKey {
  const id = createHash('sha256').update(text).digest('base64');
  const hit = cache.get(id);
  if (hit) return hit;
  const result = convert(text);
  if (cache.size >= CACHE_LIMIT) cache.clear();
  cache.set(id, result);
  return result;
}

/**
 * usablePrivateKey with a memo by the text itself, for one pass over a document: each of
 * thousands of hops naming the same key costs a Map lookup instead of a sha256 of the key.
 */
export function privateKeyReader(): (text: string) => UsableKey {
  const memo = new Map<string, UsableKey>();
  return (text) => {
    let r = memo.get(text);
    if (!r) memo.set(text, (r = usablePrivateKey(text)));
    return r;
  };
}

function convert(text: string): UsableKey {
  const direct = ssh2Reads(text);
  if (direct.ok) return { ok: true, key: text, type: direct.type };
  if (direct.encrypted) return { ok: false, problem: ENCRYPTED };
  if (direct.publicKey) return { ok: false, problem: 'is a public key; the private key is needed here' };
  if (/-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type:\s*4,ENCRYPTED/.test(text)) return { ok: false, problem: ENCRYPTED };
  let key: KeyObject;
  try {
    key = createPrivateKey({ key: text, format: 'pem' });
  } catch (err) {
    const code = (err as { code?: string }).code ?? '';
    // OpenSSL asks for a passphrase it was not given: an encrypted key in a PEM it knows.
    if (/PASSPHRASE|INTERRUPTED_OR_CANCELLED|BAD_DECRYPT/.test(code)) return { ok: false, problem: ENCRYPTED };
    return { ok: false, problem: `is not a private key in a format this gateway reads (${FORMATS})` };
  }
  let converted: string;
  switch (key.asymmetricKeyType) {
    case 'rsa':
      converted = key.export({ type: 'pkcs1', format: 'pem' }) as string;
      break;
    case 'ec':
      converted = key.export({ type: 'sec1', format: 'pem' }) as string;
      break;
    case 'ed25519':
      converted = openSshEd25519(key);
      break;
    default:
      return {
        ok: false,
        problem: `is a ${key.asymmetricKeyType ?? 'unknown'} key; SSH keys here must be RSA, ECDSA (P-256, P-384, P-521) or Ed25519`,
      };
  }
  const again = ssh2Reads(converted);
  if (!again.ok)
    return { ok: false, problem: `is a ${key.asymmetricKeyType} key that SSH cannot use (ECDSA must be on P-256, P-384 or P-521)` };
  return { ok: true, key: converted, type: again.type };
}

const ENCRYPTED = 'is encrypted with a passphrase; give the key without one (ssh-keygen -p -N "" -f FILE)';
const FORMATS = 'OpenSSH, PKCS#1, PKCS#8 or SEC1 PEM; RSA, ECDSA or Ed25519';

function ssh2Reads(text: string): { ok: true; type: string } | { ok: false; encrypted: boolean; publicKey?: boolean } {
  let parsed: ReturnType<typeof parseKey>;
  try {
    parsed = parseKey(text);
  } catch {
    return { ok: false, encrypted: false };
  }
  if (parsed instanceof Error) return { ok: false, encrypted: /encrypted|passphrase/i.test(parsed.message) };
  const first = Array.isArray(parsed) ? (parsed[0] as typeof parsed | undefined) : parsed;
  // A public key parses too; it cannot sign.
  if (!first || !first.isPrivateKey()) return { ok: false, encrypted: false, publicKey: Boolean(first) };
  return { ok: true, type: first.type };
}

/** An unencrypted Ed25519 key in OpenSSH's own format (PROTOCOL.key), the one ssh2 reads. */
function openSshEd25519(key: KeyObject): string {
  const jwk = key.export({ format: 'jwk' });
  const seed = Buffer.from(jwk.d ?? '', 'base64url');
  const pub = Buffer.from(jwk.x ?? '', 'base64url');
  const publicBlob = Buffer.concat([sshString('ssh-ed25519'), sshString(pub)]);
  // The check integers only detect a wrong passphrase; fixed, so equal keys convert to equal text.
  const check = createHash('sha256').update(pub).digest().subarray(0, 4);
  let secret = Buffer.concat([
    check,
    check,
    sshString('ssh-ed25519'),
    sshString(pub),
    sshString(Buffer.concat([seed, pub])),
    sshString(''),
  ]);
  const pad = (8 - (secret.length % 8)) % 8;
  secret = Buffer.concat([secret, Buffer.from(Array.from({ length: pad }, (_, i) => i + 1))]);
  const blob = Buffer.concat([
    Buffer.from('openssh-key-v1\0', 'latin1'),
    sshString('none'),
    sshString('none'),
    sshString(''),
    uint32(1),
    sshString(publicBlob),
    sshString(secret),
  ]);
  const lines = blob.toString('base64').match(/.{1,70}/g) ?? [];
  return `-----BEGIN OPENSSH PRIVATE KEY-----\n${lines.join('\n')}\n-----END OPENSSH PRIVATE KEY-----\n`;
}

function sshString(v: string | Buffer): Buffer {
  const b = typeof v === 'string' ? Buffer.from(v, 'utf8') : v;
  return Buffer.concat([uint32(b.length), b]);
}

function uint32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}
