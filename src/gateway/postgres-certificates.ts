// The fleet's certificates in PostgreSQL, beside the document: the stored certificates and
// keys, the ACME account, the HTTP-01 key authorizations certbot's hooks write, and the fleet's
// ACME backoff. One gateway at a time orders a domain: a session-level advisory lock on a
// connection held for the order, which PostgreSQL drops with the connection if that gateway
// dies. A stored certificate fires NOTIFY dstack_proxy_certificates, so the others install it
// at once.
//
// These tables are created on first use, not by the document's migrations: a gateway rolled
// back to a version without them still opens the document's schema.

import pg from 'pg';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../clock.js';
import type { BackoffFile } from '../reconcilers/tls/backoff.js';
import {
  backoffFrom,
  type AccountFiles,
  type IssuerLock,
  type SharedCertificates,
  type StoredCertificate,
  type StoredCertificateInfo,
} from '../reconcilers/tls/shared.js';
import { PgListener } from '../state/postgres-listener.js';
import { PG_TIMEOUT_MS } from '../state/postgres-store.js';

export const CERTIFICATES_CHANNEL = 'dstack_proxy_certificates';
/** The environment variable certbot's hooks read the connection string from. */
export const HOOK_DB_ENV = 'DSTACK_PROXY_ACME_DB';
const SCHEMA_LOCK = 'dstack_proxy_acme_schema';
/** The first key of every issuer lock (the second is the domain's hash). */
const ISSUER_LOCK_CLASS = 'dstack_proxy_acme_issuer';
/** Key authorizations older than this are removed: an order never lasts that long. */
const CHALLENGE_TTL = '1 day';

const SCHEMA = [
  `CREATE TABLE IF NOT EXISTS proxy_acme_certificates (
     domain text PRIMARY KEY,
     serial text NOT NULL,
     not_before timestamptz NOT NULL,
     not_after timestamptz NOT NULL,
     cert_pem text NOT NULL,
     key_pem text NOT NULL,
     acme_key text NOT NULL,
     issued_by text NOT NULL,
     updated_at timestamptz NOT NULL DEFAULT now()
   )`,
  `CREATE TABLE IF NOT EXISTS proxy_acme_challenges (
     token text PRIMARY KEY,
     key_authorization text NOT NULL,
     created_at timestamptz NOT NULL DEFAULT now()
   )`,
  `CREATE TABLE IF NOT EXISTS proxy_acme_accounts (
     acme_key text PRIMARY KEY,
     files jsonb NOT NULL,
     created_at timestamptz NOT NULL DEFAULT now()
   )`,
  `CREATE TABLE IF NOT EXISTS proxy_acme_backoff (
     id smallint PRIMARY KEY CHECK (id = 1),
     data jsonb NOT NULL
   )`,
  ...notifyTrigger('proxy_acme_certificates', 'NEW.domain'),
  // The backoff's changes are announced with an empty payload: readers drop their copy.
  ...notifyTrigger('proxy_acme_backoff', "''"),
];

/** A function and an AFTER INSERT OR UPDATE trigger on `table` sending `payload` on the channel. */
function notifyTrigger(table: string, payload: string): string[] {
  const name = `${table}_notify`;
  return [
    `CREATE OR REPLACE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       PERFORM pg_notify('${CERTIFICATES_CHANNEL}', ${payload});
       RETURN NULL;
     END $$`,
    `DO $$ BEGIN
       IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '${name}') THEN
         CREATE TRIGGER ${name} AFTER INSERT OR UPDATE ON ${table}
         FOR EACH ROW EXECUTE FUNCTION ${name}();
       END IF;
     END $$`,
  ];
}

export interface PgCertificatesOptions {
  connectionString: string;
  logger?: Logger;
  clock?: Clock;
  /** Connect and query timeout. Default 10 s. */
  timeoutMs?: number;
}

/**
 * Nothing is connected until first used: a gateway starting while its database is down serves
 * the certificates it has and orders none.
 */
export function openPgCertificates(o: PgCertificatesOptions): SharedCertificates {
  const timeout = o.timeoutMs ?? PG_TIMEOUT_MS;
  const config: pg.ClientConfig = { connectionString: o.connectionString };
  const pool = new pg.Pool({ ...config, query_timeout: timeout, connectionTimeoutMillis: timeout, max: 3, keepAlive: true });
  // An idle connection the server dropped is an error event on the pool: never fatal.
  pool.on('error', (err) => o.logger?.warn({ err: err.message }, 'a certificate-store connection was lost'));
  let schema: Promise<void> | null = null;
  const ready = (): Promise<void> => {
    schema ??= createSchema(pool).catch((err: unknown) => {
      schema = null; // the next use tries again
      throw err;
    });
    return schema;
  };
  const query = async <R extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<pg.QueryResult<R>> => {
    await ready();
    return pool.query<R>(text, values);
  };
  const listeners: (() => void)[] = [];
  let listener: PgListener | null = null;
  // While notifications arrive, a pass reads the certificates' figures and the backoff from
  // memory: a change to either is announced, and only then read again. So a document change
  // costs the TLS loop no query. Without the notification connection every read asks.
  let listening = false;
  let version = 0;
  let figures: Map<string, StoredCertificateInfo> | null = null;
  let backoffCopy: BackoffFile | null | undefined;
  const forget = (): void => {
    version++;
    figures = null;
    backoffCopy = undefined;
  };

  return {
    async list() {
      if (listening && figures) return new Map(figures);
      const seen = version;
      const { rows } = await query<{ domain: string; serial: string; not_before: Date; not_after: Date }>(
        'SELECT domain, serial, not_before, not_after FROM proxy_acme_certificates',
      );
      const out = new Map<string, StoredCertificateInfo>();
      for (const r of rows) out.set(r.domain, { serial: r.serial, notBefore: r.not_before.getTime(), notAfter: r.not_after.getTime() });
      if (listening && seen === version) figures = new Map(out);
      return out;
    },

    async get(domain) {
      const { rows } = await query<{
        serial: string;
        not_before: Date;
        not_after: Date;
        cert_pem: string;
        key_pem: string;
        acme_key: string;
      }>('SELECT serial, not_before, not_after, cert_pem, key_pem, acme_key FROM proxy_acme_certificates WHERE domain = $1', [domain]);
      const r = rows[0];
      if (!r) return null;
      return {
        domain,
        serial: r.serial,
        notBefore: r.not_before.getTime(),
        notAfter: r.not_after.getTime(),
        certPem: r.cert_pem,
        keyPem: r.key_pem,
        acmeKey: r.acme_key,
      };
    },

    async put(c: StoredCertificate, issuedBy: string) {
      forget();
      await query(
        `INSERT INTO proxy_acme_certificates (domain, serial, not_before, not_after, cert_pem, key_pem, acme_key, issued_by, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
         ON CONFLICT (domain) DO UPDATE SET serial = EXCLUDED.serial, not_before = EXCLUDED.not_before,
           not_after = EXCLUDED.not_after, cert_pem = EXCLUDED.cert_pem, key_pem = EXCLUDED.key_pem,
           acme_key = EXCLUDED.acme_key, issued_by = EXCLUDED.issued_by, updated_at = now()
         WHERE proxy_acme_certificates.not_after <= EXCLUDED.not_after`,
        [c.domain, c.serial, new Date(c.notBefore), new Date(c.notAfter), c.certPem, c.keyPem, c.acmeKey, issuedBy],
      );
      forget();
    },

    async lock(domain): Promise<IssuerLock | null> {
      await ready();
      const client = await pool.connect();
      let got = false;
      try {
        const { rows } = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock(hashtext($1), hashtext($2)) AS ok', [
          ISSUER_LOCK_CLASS,
          domain,
        ]);
        got = rows[0]?.ok === true;
      } finally {
        if (!got) client.release();
      }
      if (!got) return null;
      // The connection dropped while held (a database restart): the lock went with it, and the
      // order goes on; what it stores is checked like any other certificate.
      const lost = (err: Error): void => o.logger?.warn({ domain, err: err.message }, 'lost the connection holding an issuer lock');
      client.on('error', lost);
      let released = false;
      return {
        async release() {
          if (released) return;
          released = true;
          client.removeListener('error', lost);
          try {
            await client.query('SELECT pg_advisory_unlock(hashtext($1), hashtext($2))', [ISSUER_LOCK_CLASS, domain]);
            client.release();
          } catch (err) {
            // A connection we cannot unlock on is closed: its session's locks go with it.
            client.release(err as Error);
          }
        },
      };
    },

    async challenge(token) {
      const { rows } = await query<{ key_authorization: string }>(
        `SELECT key_authorization FROM proxy_acme_challenges WHERE token = $1 AND created_at > now() - interval '${CHALLENGE_TTL}'`,
        [token],
      );
      return rows[0]?.key_authorization ?? null;
    },

    async account(acmeKey) {
      const { rows } = await query<{ files: unknown }>('SELECT files FROM proxy_acme_accounts WHERE acme_key = $1', [acmeKey]);
      const files = rows[0]?.files;
      if (!files || typeof files !== 'object' || Array.isArray(files)) return null;
      const out: AccountFiles = {};
      for (const [path, text] of Object.entries(files)) if (typeof text === 'string') out[path] = text;
      return out;
    },

    async saveAccount(acmeKey, files) {
      await query('INSERT INTO proxy_acme_accounts (acme_key, files) VALUES ($1, $2) ON CONFLICT (acme_key) DO NOTHING', [
        acmeKey,
        JSON.stringify(files),
      ]);
    },

    backoff: {
      async read() {
        if (listening && backoffCopy !== undefined) return backoffCopy && structuredClone(backoffCopy);
        const seen = version;
        const { rows } = await query<{ data: unknown }>('SELECT data FROM proxy_acme_backoff WHERE id = 1');
        const data = rows[0] ? backoffFrom(rows[0].data) : null;
        if (listening && seen === version) backoffCopy = data && structuredClone(data);
        return data;
      },
      async change(mutate: (data: BackoffFile) => void) {
        forget();
        await ready();
        const client = await pool.connect();
        let broken: Error | undefined;
        try {
          await client.query('BEGIN');
          await client.query(`INSERT INTO proxy_acme_backoff (id, data) VALUES (1, '{}') ON CONFLICT (id) DO NOTHING`);
          const { rows } = await client.query<{ data: unknown }>('SELECT data FROM proxy_acme_backoff WHERE id = 1 FOR UPDATE');
          const data = backoffFrom(rows[0]?.data);
          mutate(data);
          await client.query('UPDATE proxy_acme_backoff SET data = $1 WHERE id = 1', [JSON.stringify(data)]);
          await client.query('COMMIT');
          forget(); // a read since the start may have kept the row as it was
        } catch (err) {
          await client.query('ROLLBACK').catch((e: unknown) => (broken = e as Error));
          throw err;
        } finally {
          client.release(broken);
        }
      },
    },

    hookEnv: () => ({ [HOOK_DB_ENV]: o.connectionString }),

    onChange(fn) {
      listeners.push(fn);
      if (listener) return;
      listener = new PgListener({
        config,
        channel: CERTIFICATES_CHANNEL,
        onNotify: (domain) => {
          forget();
          if (domain !== '') listeners.forEach((l) => l());
        },
        // A certificate stored while we were not listening is picked up by the pass this starts.
        onConnected: () => {
          forget();
          listening = true;
          listeners.forEach((l) => l());
        },
        onLost: (err) => {
          listening = false;
          forget();
          o.logger?.warn({ err: (err as Error)?.message }, 'lost the certificate notifications; reconnecting');
        },
        clock: o.clock ?? systemClock,
      });
      listener.start();
    },

    async close() {
      await listener?.stop();
      await pool.end().catch(() => undefined);
    },
  };
}

async function createSchema(pool: pg.Pool): Promise<void> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query('SELECT pg_advisory_lock(hashtext($1))', [SCHEMA_LOCK]);
    try {
      for (const sql of SCHEMA) await client.query(sql);
    } finally {
      await client.query('SELECT pg_advisory_unlock(hashtext($1))', [SCHEMA_LOCK]);
    }
  } catch (err) {
    broken = err as Error;
    throw err;
  } finally {
    client.release(broken);
  }
}
