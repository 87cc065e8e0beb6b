// A JSON document that repeats a key is refused as YAML's is, on the HTTP PUT and in
// `dstack-proxy validate`: JSON.parse would keep the last one, so a templated
// `"auth":true,"auth":false` would switch auth off unnoticed.

import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startServerProxy, type RunningServerProxy } from '../../src/daemon/server-proxy.js';
import { runCli } from '../helpers/cli.js';
import { tmpDir } from '../helpers/tmp.js';
import { send } from '../server-proxy/harness.js';

const DOC =
  '{"apiVersion":"proxy.dstack.ai/v1alpha1","kind":"ProxyState","spec":{"projects":[{"name":"main"}],' +
  '"services":[{"project":"main","run":"web","auth":true,"auth":false}]}}';

let proxy: RunningServerProxy;
const t = tmpDir('dp-dupkeys-');
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

it('PUT of JSON with a repeated key → 400 with the path, and nothing stored', async () => {
  const r = await send(`${proxy.apiUrl!}/api/v1/state`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: DOC });
  expect(r.status).toBe(400);
  expect(r.json()).toMatchObject({
    code: 'DP_ERR_MALFORMED_DOCUMENT',
    errors: [{ path: '/spec/services/0/auth', message: expect.stringMatching(/the key "auth" appears twice/) }],
  });
  expect(proxy.current().generation).toBe(0);
  // The same text without the repeat is fine.
  const ok = await send(`${proxy.apiUrl!}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: DOC.replace(',"auth":false', ''),
  });
  expect(ok.status).toBe(200);
});

it('dstack-proxy validate refuses it with the path', async () => {
  const file = path.join(t.dir, 'dup.json');
  writeFileSync(file, DOC);
  const r = await runCli(['validate', '-f', file]);
  expect(r.code).toBe(1);
  expect(r.stderr).toMatch(/^\/spec\/services\/0\/auth: Malformed JSON: the key "auth" appears twice/m);
});
