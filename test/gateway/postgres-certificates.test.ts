// The fleet's certificate store on a real PostgreSQL: certificates (a later one replaces, an
// older one never does), the issuer lock (one holder; released by the holder, or by PostgreSQL
// when the holder's connection dies), the key authorizations certbot's built hook stores and
// removes, the account (the first stored stays), the fleet's backoff (two gateways' changes
// both land), and the notification a stored certificate sends.

import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SharedBackoffStore } from '../../src/reconcilers/tls/backoff.js';
import { challengeHookPath } from '../../src/reconcilers/tls/certbot.js';
import type { SharedCertificates, StoredCertificate } from '../../src/reconcilers/tls/shared.js';
import { openPgCertificates } from '../../src/gateway/postgres-certificates.js';
import { eventually } from '../helpers/nginx.js';
import { createTestDatabase, type TestDatabase } from '../helpers/postgres.js';

let db: TestDatabase;
let a: SharedCertificates;
let b: SharedCertificates;
const dir = mkdtempSync(join(tmpdir(), 'dp-pgcerts-'));

beforeAll(async () => {
  db = await createTestDatabase('dp_certs');
  a = openPgCertificates({ connectionString: db.connectionString });
  b = openPgCertificates({ connectionString: db.connectionString });
}, 60_000);

afterAll(async () => {
  await a?.close();
  await b?.close();
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});

const cert = (serial: string, notAfter: number): StoredCertificate => ({
  domain: 'a.gw.test',
  serial,
  notBefore: notAfter - 90 * 86_400_000,
  notAfter,
  certPem: `-----BEGIN CERTIFICATE-----\n${serial}\n-----END CERTIFICATE-----\n`,
  keyPem: `-----BEGIN PRIVATE KEY-----\nsecret-${serial}\n-----END PRIVATE KEY-----\n`,
  acmeKey: 'k1',
});

describe('the PostgreSQL certificate store', () => {
  it('stores certificates for the fleet: a later one replaces the stored one, an older one does not', async () => {
    const changes: number[] = [];
    b.onChange(() => changes.push(Date.now()));
    await eventually(async () => (changes.length > 0 ? true : undefined)); // the first connect runs it once
    const before = changes.length;
    const now = Date.now();
    await a.put(cert('AA01', now + 60 * 86_400_000), 'test');
    expect((await b.get('a.gw.test'))?.serial).toBe('AA01');
    await a.put(cert('AA02', now + 90 * 86_400_000), 'test');
    await a.put(cert('AA00', now + 30 * 86_400_000), 'test');
    const stored = await b.get('a.gw.test');
    expect(stored).toMatchObject({ serial: 'AA02', acmeKey: 'k1', notAfter: now + 90 * 86_400_000 });
    expect(stored?.keyPem).toContain('secret-AA02');
    // Its figures, as another gateway's pass reads them once the change is announced.
    const figures = await eventually(async () => {
      const f = (await b.list()).get('a.gw.test');
      return f?.serial === 'AA02' ? f : undefined;
    });
    expect(figures).toEqual({ serial: 'AA02', notBefore: now, notAfter: now + 90 * 86_400_000 });
    expect(await b.get('other.gw.test')).toBeNull();
    // The other store heard of the stored certificates without polling.
    await eventually(async () => (changes.length > before ? true : undefined));
  });

  it('lets one gateway at a time hold a domain: released by the holder, or when its connection dies', async () => {
    const held = await a.lock('a.gw.test');
    expect(held).not.toBeNull();
    expect(await b.lock('a.gw.test')).toBeNull();
    expect(await a.lock('a.gw.test')).toBeNull(); // a second order on the same gateway waits too
    const other = await b.lock('b.gw.test'); // another domain is free
    expect(other).not.toBeNull();
    await other!.release();
    await held!.release();
    const again = await b.lock('a.gw.test');
    expect(again).not.toBeNull();
    // The holder's connection ends (its process died): PostgreSQL drops the lock.
    const admin = new pg.Client({ connectionString: db.connectionString });
    await admin.connect();
    try {
      await admin.query(
        `SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      );
    } finally {
      await admin.end();
    }
    const taken = await eventually(async () => (await a.lock('a.gw.test').catch(() => null)) ?? undefined);
    await taken.release();
    await again!.release(); // its connection is gone: no error
  });

  it("stores and removes the key authorizations through certbot's hook, and answers them", async () => {
    const hook = challengeHookPath();
    expect(existsSync(hook), `${hook} (npm run build)`).toBe(true);
    const webroot = join(dir, 'webroot');
    const run = (mode: string, env: Record<string, string>): Promise<{ code: number; stderr: string }> =>
      new Promise((resolve) =>
        execFile(
          process.execPath,
          [hook, mode],
          { env: { ...process.env, ...b.hookEnv(), DSTACK_PROXY_ACME_WEBROOT: webroot, ...env } },
          (err, _o, stderr) => resolve({ code: err ? Number(err.code ?? 1) : 0, stderr }),
        ),
      );
    const token = 'tok_' + 'b'.repeat(40);
    const validation = `${token}.thumb_0123456789`;
    expect(await run('auth', { CERTBOT_TOKEN: token, CERTBOT_VALIDATION: validation })).toEqual({ code: 0, stderr: '' });
    expect(await a.challenge(token)).toBe(validation);
    expect(readFileSync(join(webroot, '.well-known', 'acme-challenge', token), 'utf8')).toBe(validation);
    expect((await run('cleanup', { CERTBOT_TOKEN: token })).code).toBe(0);
    expect(await a.challenge(token)).toBeNull();
    expect(existsSync(join(webroot, '.well-known', 'acme-challenge', token))).toBe(false);
    // Not base64url: refused, nothing written; and the connection string never in its output.
    const bad = await run('auth', { CERTBOT_TOKEN: '../../etc/passwd', CERTBOT_VALIDATION: 'x.y' });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/not base64url/);
    const down = await run('auth', {
      CERTBOT_TOKEN: token,
      CERTBOT_VALIDATION: validation,
      DSTACK_PROXY_ACME_DB: 'postgres://u:hunter2@127.0.0.1:1/x',
    });
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/could not store the HTTP-01 key authorization/);
    expect(down.stderr).not.toContain('hunter2');
  });

  it('keeps the first account stored for a set of ACME settings', async () => {
    expect(await a.account('k1')).toBeNull();
    await a.saveAccount('k1', { 'abc/meta.json': '{"a":1}', 'abc/private_key.json': '{"k":"first"}' });
    await b.saveAccount('k1', { 'def/private_key.json': '{"k":"second"}' });
    expect(await b.account('k1')).toEqual({ 'abc/meta.json': '{"a":1}', 'abc/private_key.json': '{"k":"first"}' });
  });

  it("counts every gateway's ACME attempts in one backoff: concurrent changes all land", async () => {
    const x = new SharedBackoffStore(a.backoff);
    const y = new SharedBackoffStore(b.backoff);
    const now = Date.now();
    await Promise.all(Array.from({ length: 10 }, (_, i) => (i % 2 ? x : y).update((d) => d.orders.push(now + i), now)));
    await x.change((d) => (d.domains['a.gw.test'] = { failedAttempts: 1, attempts: [now] }), now);
    // Seen by the gateway that made it before the flush, by the other only after.
    expect((await x.get('a.gw.test'))?.failedAttempts).toBe(1);
    expect(await y.get('a.gw.test')).toBeUndefined();
    await x.flush();
    // The other reads its copy until the change's notification arrives (milliseconds).
    await eventually(async () => ((await y.get('a.gw.test'))?.failedAttempts === 1 ? true : undefined));
    expect((await y.load()).orders.sort()).toEqual(Array.from({ length: 10 }, (_, i) => now + i));
    // What the database holds is input: a damaged row reads as an empty backoff, not a crash.
    const admin = new pg.Client({ connectionString: db.connectionString });
    await admin.connect();
    await admin.query(`UPDATE proxy_acme_backoff SET data = '{"domains": {"x": 5}, "orders": ["a", 3]}'`);
    await admin.end();
    await eventually(async () => ((await y.load()).orders.length === 1 ? true : undefined));
    expect(await y.load()).toEqual({ version: 1, domains: {}, orders: [3] });
  });
});
