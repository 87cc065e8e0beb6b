// dstack's server generates project keys as RSA-2048 in PKCS#8 PEM (`BEGIN PRIVATE KEY`). The
// gateway end to end with such a key, as `openssl genpkey` writes it: the PUT is accepted, the
// replica behind a real sshd becomes Ready and requests through Nginx reach the app — instead of
// a live site answering 503 forever. A passphrase-protected key is refused by the PUT itself.

import type { Server } from 'node:http';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { keyBody, keyInFormat } from '../helpers/keys.js';
import { eventually } from '../helpers/nginx.js';
import { freePort } from '../helpers/ports.js';
import { startSshd, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, integrationDoc, startGatewayWith } from './integration-harness.js';

const DOMAIN = 'pkcs8.gw.test';
let tmp: ReturnType<typeof tmpDir>;
let key: { privateKey: string; publicKey: string };
let sshd: TestSshd;
let app: Server;
let appPort: number;
let t: TestGateway;

beforeAll(async () => {
  tmp = tmpDir('dp-int-pkcs8-');
  key = keyInFormat(tmp.dir, 'rsa-pkcs8');
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  appPort = await freePort();
  app = await startEcho('app-pkcs8', { port: appPort });
  t = await startGatewayWith({}, { ssh: { keepaliveIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  if (app) await close(app);
  tmp?.cleanup();
});

const doc = (privateKey: string) =>
  integrationDoc({
    sshPrivateKey: privateKey,
    services: [
      {
        run: 'pkcs8',
        domain: DOMAIN,
        replicas: [{ id: 'pkcs8-r0', appPort, ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user } }],
      },
    ],
  });

it('a PKCS#8 RSA project key: the replica becomes Ready and traffic flows through Nginx', async () => {
  expect(key.privateKey.startsWith('-----BEGIN PRIVATE KEY-----')).toBe(true);
  const r = await putState(t, doc(key.privateKey));
  expect(r.status).toBe(200);
  const reply = await eventually(async () => {
    const x = await call({ port: t.httpPort, host: DOMAIN, path: '/hello' }).catch(() => undefined);
    return x?.status === 200 ? x : undefined;
  }, 30_000);
  expect((JSON.parse(reply.body) as { name: string }).name).toBe('app-pkcs8');
  const status = await api(t, { path: '/api/v1/status' });
  const objects =
    (status.json as { loops: Record<string, { objects: Record<string, { conditions: { type: string; status: string }[] }> }> }).loops.ssh
      ?.objects ?? {};
  expect(objects['main/pkcs8/pkcs8-r0']?.conditions.find((c) => c.type === 'Ready')?.status).toBe('True');
  expect(sshd.accepted()).toBeGreaterThanOrEqual(1);
}, 60_000);

it('a passphrase-protected key: 422 with the JSON path, no part of the key, nothing changed', async () => {
  const file = join(tmp.dir, 'locked');
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', 'a passphrase', '-f', file]);
  const locked = readFileSync(file, 'utf8');
  const before = ((await api(t, { path: '/api/v1/state' })).json as { metadata: { generation: number } }).metadata.generation;
  const r = await putState(t, doc(locked));
  expect(r.status).toBe(422);
  expect(r.json.errors).toEqual([
    { path: '/spec/projects/0/sshPrivateKey', message: expect.stringMatching(/encrypted with a passphrase/) },
  ]);
  for (const line of keyBody(locked)) expect(r.body).not.toContain(line.slice(0, 24));
  expect(((await api(t, { path: '/api/v1/state' })).json as { metadata: { generation: number } }).metadata.generation).toBe(before);
});
