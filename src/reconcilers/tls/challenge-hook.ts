// certbot's manual HTTP-01 hooks when certificates are shared by a fleet: `auth` stores the key
// authorization in the database, so whichever gateway the CA's request reaches answers it, and
// writes it to this gateway's webroot too; `cleanup` removes both. certbot waits for the hook
// before it asks the CA to validate, so the answer is in place first. Run by certbot as
// `node challenge-hook.js auth|cleanup`, with CERTBOT_TOKEN and CERTBOT_VALIDATION set by
// certbot and the database and webroot by the gateway.

import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';

/** ACME tokens and key authorizations are base64url (RFC 8555 §8.3); anything else is refused. */
const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;
const KEY_AUTHORIZATION = /^[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}$/;

async function main(): Promise<number> {
  const mode = process.argv[2];
  const token = process.env.CERTBOT_TOKEN ?? '';
  const validation = process.env.CERTBOT_VALIDATION ?? '';
  const db = process.env.DSTACK_PROXY_ACME_DB;
  const webroot = process.env.DSTACK_PROXY_ACME_WEBROOT;
  if ((mode !== 'auth' && mode !== 'cleanup') || !db || !webroot) {
    process.stderr.write('usage: challenge-hook.js auth|cleanup, run by certbot for a gateway sharing its certificates\n');
    return 2;
  }
  if (!TOKEN.test(token) || (mode === 'auth' && !KEY_AUTHORIZATION.test(validation))) {
    process.stderr.write('certbot gave a challenge token or key authorization that is not base64url\n');
    return 1;
  }
  const dir = join(webroot, '.well-known', 'acme-challenge');
  const client = new pg.Client({ connectionString: db, connectionTimeoutMillis: 10_000, query_timeout: 10_000 });
  try {
    await client.connect();
    if (mode === 'auth') {
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, token), validation, { mode: 0o644 });
      await client.query(`DELETE FROM proxy_acme_challenges WHERE created_at < now() - interval '1 day'`);
      await client.query(
        `INSERT INTO proxy_acme_challenges (token, key_authorization) VALUES ($1, $2)
         ON CONFLICT (token) DO UPDATE SET key_authorization = EXCLUDED.key_authorization, created_at = now()`,
        [token, validation],
      );
    } else {
      await rm(join(dir, token), { force: true });
      await client.query('DELETE FROM proxy_acme_challenges WHERE token = $1', [token]);
    }
    return 0;
  } catch (err) {
    // Never the connection string: only what went wrong.
    process.stderr.write(`could not ${mode === 'auth' ? 'store' : 'remove'} the HTTP-01 key authorization: ${(err as Error).message}\n`);
    return 1;
  } finally {
    await client.end().catch(() => undefined);
  }
}

process.exitCode = await main();
