// The in-server model API (`/proxy/models/<project>`, the standalone server proxy over SQLite and
// its own SSH loop) with the official `openai` SDK: a model whose replicas are all unready is a
// JSON 503 in the OpenAI error shape — not a 500 — and a model with no replicas a 503 too.

import OpenAI from 'openai';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startServerProxy, type RunningServerProxy } from '../../src/daemon/server-proxy.js';
import { TEST_KEY_A } from '../helpers/keys.js';
import { freePort } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { send } from '../server-proxy/harness.js';

const TOKEN = 'in-server-member-token';
let proxy: RunningServerProxy;
const t = tmpDir('dp-models-unready-');

beforeAll(async () => {
  const deadSsh = await freePort();
  proxy = await startServerProxy(
    { db: `sqlite:${t.dir}/proxy.db`, port: 0, apiPort: 0, stateDir: `${t.dir}/state` },
    { logger: pino({ level: 'silent' }), authorize: async (project, token) => (project === 'main' && token === TOKEN ? 'allow' : 'deny') },
  );
  const doc = {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'main', sshPrivateKey: TEST_KEY_A }],
      services: [
        {
          project: 'main',
          run: 'down',
          model: { name: 'acme/down', format: 'openai', prefix: '/v1' },
          // No sshd listens there: the replica never becomes Ready.
          replicas: [{ id: 'down-r0', appPort: 8000, ssh: { host: '127.0.0.1', port: deadSsh, user: 'nobody' } }],
        },
        { project: 'main', run: 'none', model: { name: 'acme/none', format: 'openai', prefix: '/v1' } },
      ],
    },
  };
  const r = await send(`${proxy.apiUrl!}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  expect(r.status).toBe(200);
}, 60_000);

afterAll(async () => {
  await proxy?.close();
  t.cleanup();
});

const client = (): OpenAI => new OpenAI({ apiKey: TOKEN, baseURL: `${proxy.url}/proxy/models/main`, maxRetries: 0 });

it.each([
  ['whose replicas are all unready', 'acme/down', /no ready replica/],
  ['with no replicas', 'acme/none', /no running replicas/],
])('a model %s: 503 in the OpenAI error shape', async (_name, model, message) => {
  const err = await client()
    .chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] })
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(OpenAI.APIError);
  const e = err as InstanceType<typeof OpenAI.APIError>;
  expect(e.status).toBe(503);
  expect(e.error).toMatchObject({ message: expect.stringMatching(message), type: 'upstream_error', code: 503 });
  // The process is fine: the model list still answers.
  expect((await client().models.list()).data.map((m) => m.id)).toContain(model);
});
