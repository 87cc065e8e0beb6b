// Secrets are never echoed: a rejected document — PUT over HTTP, `dstack-proxy validate`, a row
// written straight into SQLite or PostgreSQL — is reported by the rule it broke, and no part of
// eabHmacKey, sshPrivateKey or privateKey reaches the response, the status or a log line.

import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import Database from 'better-sqlite3';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServerProxy, type RunningServerProxy } from '../../src/daemon/server-proxy.js';
import { runCli } from '../helpers/cli.js';
import { TEST_KEY_A } from '../helpers/keys.js';
import { eventually } from '../helpers/nginx.js';
import { createTestDatabase, ensurePostgres, type TestDatabase } from '../helpers/postgres.js';
import { tmpDir } from '../helpers/tmp.js';
import { send } from './harness.js';

/** Random-looking, so any 4 characters of it in an output are a leak, not a coincidence. */
const SECRET = 'Zq8xW3kP9vL2mN7bT4yR6cH1jF5gD0sAuE';

/** Every 4-character window of the secret that occurs in `text`. */
function leaks(text: string, secret = SECRET): string[] {
  const found: string[] = [];
  for (let i = 0; i + 4 <= secret.length; i++) if (text.includes(secret.slice(i, i + 4))) found.push(secret.slice(i, i + 4));
  return found;
}

const VALID_KEY = TEST_KEY_A;

function docWith(edit: (spec: Record<string, any>) => void): Record<string, unknown> {
  const spec: Record<string, any> = {
    acme: { eabKid: 'kid-1', eabHmacKey: 'c2VjcmV0' },
    projects: [{ name: 'main' }],
    services: [{ project: 'main', run: 'web', replicas: [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: 9 } }] }],
  };
  edit(spec);
  return { apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec };
}

const sshReplica = (hop: Record<string, unknown>) => ({
  id: 'r1',
  appPort: 8000,
  ssh: { host: '127.0.0.1', user: 'u' },
  ...hop,
});

/** Documents each carrying SECRET in a secret field the schema refuses. */
const BAD: [string, Record<string, unknown>][] = [
  ['an eabHmacKey with a trailing newline', docWith((s) => (s.acme.eabHmacKey = `${SECRET}\n`))],
  ['an eabHmacKey with one bad character', docWith((s) => (s.acme.eabHmacKey = `${SECRET.slice(0, 10)}!${SECRET.slice(10)}`))],
  ['an eabHmacKey longer than 512 characters', docWith((s) => (s.acme.eabHmacKey = SECRET.repeat(20)))],
  ['an eabHmacKey that is an array', docWith((s) => (s.acme.eabHmacKey = [SECRET]))],
  ['an sshPrivateKey that is a number-like object', docWith((s) => (s.projects[0].sshPrivateKey = { key: SECRET }))],
  ['an sshPrivateKey longer than 64 KiB', docWith((s) => (s.projects[0].sshPrivateKey = SECRET.repeat(2000)))],
  [
    'a privateKey of an sshProxy hop that is an array',
    docWith((s) => {
      s.projects[0].sshPrivateKey = VALID_KEY;
      s.services[0].replicas = [sshReplica({ sshProxy: { host: 'jump', user: 'j', privateKey: [SECRET] } })];
    }),
  ],
  [
    'a privateKey of an sshHeadProxy hop that is an object',
    docWith((s) => {
      s.projects[0].sshPrivateKey = VALID_KEY;
      s.services[0].replicas = [sshReplica({ sshHeadProxy: { host: 'head', user: 'h', privateKey: { pem: SECRET } } })];
    }),
  ],
];

describe('a rejected PUT or validate names the rule, never the secret', () => {
  let proxy: RunningServerProxy;
  const t = tmpDir('dp-secrets-');
  beforeAll(async () => {
    proxy = await startServerProxy(
      { db: `sqlite:${t.dir}/proxy.db`, port: 0, apiPort: 0, stateDir: `${t.dir}/state` },
      { logger: pino({ level: 'silent' }) },
    );
  });
  afterAll(async () => {
    await proxy?.close();
    t.cleanup();
  });

  it.each(BAD)('PUT with %s → 422 without any part of it', async (_name, doc) => {
    const r = await send(`${proxy.apiUrl!}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(doc),
    });
    expect(r.status).toBe(422);
    const body = r.json<{ code: string; errors: { path: string; message: string }[] }>();
    expect(body.code).toBe('DP_ERR_INVALID_DOCUMENT');
    expect(body.errors.some((e) => /eabHmacKey|sshPrivateKey|privateKey/.test(e.path))).toBe(true);
    expect(leaks(r.body.toString())).toEqual([]);
  });

  it('says what is wrong with a bad eabHmacKey without showing it', async () => {
    const r = await send(`${proxy.apiUrl!}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(BAD[0]![1]),
    });
    expect(r.json<{ errors: unknown[] }>().errors).toEqual([
      { path: '/spec/acme/eabHmacKey', message: expect.stringMatching(/must be base64.*a line break at the end.*not shown/) },
    ]);
  });

  it('PUT of malformed JSON around a secret → 400 without any part of it', async () => {
    for (const body of [`${SECRET} x`, `{"spec":{"acme":{"eabHmacKey":"${SECRET}" oops}}}`, `not json ${SECRET}`, `{"a":"${SECRET}\n"}`]) {
      const r = await send(`${proxy.apiUrl!}/api/v1/state`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body });
      expect(r.status).toBe(400);
      expect(leaks(r.body.toString())).toEqual([]);
    }
  });

  it.each(BAD.slice(0, 3))('dstack-proxy validate with %s → exit 1 without any part of it', async (_name, doc) => {
    const file = path.join(t.dir, 'doc.json');
    writeFileSync(file, JSON.stringify(doc));
    const r = await runCli(['validate', '-f', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/\/spec\/acme\/eabHmacKey: must be base64/);
    expect(leaks(r.stdout + r.stderr)).toEqual([]);
  });
});

/** A server proxy whose pino log lines are kept, parsed, for the assertions. */
async function startLogged(
  db: string,
  dir: string,
): Promise<{ proxy: RunningServerProxy; lines: () => Record<string, unknown>[]; raw: string[] }> {
  const raw: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      raw.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
  const proxy = await startServerProxy({ db, port: 0, apiPort: 0, stateDir: dir }, { logger: pino({ level: 'debug' }, sink) });
  return {
    proxy,
    raw,
    lines: () => raw.map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

interface Status {
  store: { lastError?: { reason: string; message: string; issues?: { path: string; message: string }[] } };
}

async function expectRejectedWithoutLeak(proxy: RunningServerProxy, raw: string[], lines: () => Record<string, unknown>[]): Promise<void> {
  const status = await eventually(async () => {
    const s = (await send(`${proxy.apiUrl!}/api/v1/status`)).json<Status>();
    return s.store.lastError?.reason === 'invalid' ? s : undefined;
  }, 10_000);
  expect(status.store.lastError?.issues?.map((i) => i.path)).toContain('/spec/acme/eabHmacKey');
  expect(leaks(JSON.stringify(status))).toEqual([]);
  const warn = await eventually(() => lines().find((l) => l.level === 40 && /is invalid and was not applied/.test(String(l.msg))), 5_000);
  expect(warn).toMatchObject({ store: expect.any(String) });
  expect(leaks(raw.join('\n'))).toEqual([]);
}

const havePostgres = await ensurePostgres();
const ROW = docWith((s) => (s.acme.eabHmacKey = `${SECRET}\n`));

describe('an invalid row written straight into the database', () => {
  it('SQLite: status and logs name the rule, not the secret', async () => {
    const t = tmpDir('dp-secrets-sqlite-');
    const file = path.join(t.dir, 'proxy.db');
    const { proxy, raw, lines } = await startLogged(`sqlite:${file}`, path.join(t.dir, 'state'));
    try {
      const db = new Database(file);
      try {
        db.pragma('busy_timeout = 5000');
        db.prepare(
          "UPDATE proxy_state SET generation = 7, document = ?, hash = NULL, updated_at = '2026-12-01T00:00:00Z' WHERE id = 1",
        ).run(JSON.stringify(ROW));
      } finally {
        db.close();
      }
      await expectRejectedWithoutLeak(proxy, raw, lines);
    } finally {
      await proxy.close();
      t.cleanup();
    }
  });

  it('SQLite: a row that is not even JSON is reported without quoting it', async () => {
    const t = tmpDir('dp-secrets-sqlite-');
    const file = path.join(t.dir, 'proxy.db');
    const { proxy, raw } = await startLogged(`sqlite:${file}`, path.join(t.dir, 'state'));
    try {
      const db = new Database(file);
      db.prepare('UPDATE proxy_state SET generation = 3, document = ? WHERE id = 1').run(`{"spec":{"acme":{"eabHmacKey":"${SECRET}"`);
      db.close();
      const status = await eventually(async () => {
        const s = (await send(`${proxy.apiUrl!}/api/v1/status`)).json<Status>();
        return s.store.lastError ? s : undefined;
      }, 10_000);
      expect(status.store.lastError?.message).toMatch(/not JSON/);
      expect(leaks(JSON.stringify(status) + raw.join('\n'))).toEqual([]);
    } finally {
      await proxy.close();
      t.cleanup();
    }
  });

  it.skipIf(!havePostgres)('PostgreSQL: status and logs name the rule, not the secret', async () => {
    const database: TestDatabase = await createTestDatabase('dp_secrets');
    const t = tmpDir('dp-secrets-pg-');
    const { proxy, raw, lines } = await startLogged(database.connectionString, t.dir);
    try {
      const client = new pg.Client(database.config);
      await client.connect();
      try {
        await client.query('UPDATE proxy_state SET generation = 7, document = $1::jsonb, hash = NULL, updated_at = now() WHERE id = 1', [
          JSON.stringify(ROW),
        ]);
      } finally {
        await client.end();
      }
      await expectRejectedWithoutLeak(proxy, raw, lines);
    } finally {
      await proxy.close();
      await database.drop();
      t.cleanup();
    }
  });
});
