// Two server-proxy processes' worth (two instances, as the CLI starts them) on one PostgreSQL:
// a PUT to A is served by B within 1 s; concurrent PUTs with If-Match have exactly one winner.

import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startServerProxy, type RunningServerProxy } from '../../src/daemon/server-proxy.js';
import { eventually } from '../helpers/nginx.js';
import { createTestDatabase, type TestDatabase } from '../helpers/postgres.js';
import { tmpDir } from '../helpers/tmp.js';
import { directService, doc, send } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

let db: TestDatabase;
let a: RunningServerProxy;
let b: RunningServerProxy;
let replica: TestReplica;
const dirs: (() => void)[] = [];

async function start(): Promise<RunningServerProxy> {
  const { dir, cleanup } = tmpDir('dp-sp-pg-');
  dirs.push(cleanup);
  return startServerProxy({ db: db.connectionString, port: 0, apiPort: 0, stateDir: dir }, { logger: pino({ level: 'silent' }) });
}

beforeAll(async () => {
  db = await createTestDatabase('dp_server_proxy');
  replica = await startReplica();
  [a, b] = await Promise.all([start(), start()]); // migrations under the advisory lock, at once
}, 60_000);

afterAll(async () => {
  await a?.close();
  await b?.close();
  await replica?.close();
  await db?.drop();
  for (const c of dirs) c();
});

const put = (url: string, body: unknown, ifMatch?: number) =>
  send(`${url}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json', ...(ifMatch === undefined ? {} : { 'if-match': String(ifMatch) }) },
    body: JSON.stringify(body),
  });

it('a PUT to A is served by B within 1 s', async () => {
  const r = await put(a.apiUrl!, doc([directService('test-proj', 'scaled', replica.port)]));
  expect(r.status).toBe(200);
  const committed = Date.now();
  await eventually(async () => ((await send(`${b.url}/proxy/services/test-proj/scaled/echo`)).status === 200 ? true : undefined), 5_000);
  expect(Date.now() - committed).toBeLessThan(1_000);
  expect(b.current().generation).toBe(r.json<{ generation: number }>().generation);
});

it('concurrent PUTs with the same If-Match: exactly one winner', async () => {
  const gen = (await send(`${a.apiUrl!}/api/v1/state`)).json<{ metadata: { generation: number } }>().metadata.generation;
  const writers = Array.from({ length: 10 }, (_, i) =>
    put(i % 2 ? a.apiUrl! : b.apiUrl!, doc([directService('test-proj', `race-${i}`, replica.port)]), gen),
  );
  const statuses = (await Promise.all(writers)).map((r) => r.status);
  expect(statuses.filter((s) => s === 200)).toHaveLength(1);
  expect(statuses.filter((s) => s === 409)).toHaveLength(9);
  await eventually(() => (a.current().generation === gen + 1 && b.current().generation === gen + 1 ? true : undefined), 2_000);
});
