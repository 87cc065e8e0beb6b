// The in-server model API (`/proxy/models/<project>`) and a service behind an in-replica router
// (`routerAllowlist`): the model API's calls obey the allowlist the proxied paths do. A model
// whose prefix is outside it (`/openai/v1/chat/completions`) is refused before any replica with
// the allowlist's words, as the gateway's Nginx site refuses it; one under `/v1/` is served.

import OpenAI, { PermissionDeniedError } from 'openai';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startServerProxy, type RunningServerProxy } from '../../src/daemon/server-proxy.js';
import { tmpDir } from '../helpers/tmp.js';
import { send } from '../server-proxy/harness.js';
import { startOpenAIReplica, type Replica } from './replicas.js';

const TOKEN = 'in-server-member-token';

let proxy: RunningServerProxy;
let replica: Replica;
const t = tmpDir('dp-models-router-');

const service = (run: string, model: string, prefix: string): Record<string, unknown> => ({
  project: 'main',
  run,
  routerAllowlist: true,
  model: { name: model, format: 'openai', prefix },
  replicas: [{ id: `${run}-r0`, appPort: replica.port, direct: { host: '127.0.0.1', port: replica.port } }],
});

beforeAll(async () => {
  replica = await startOpenAIReplica();
  proxy = await startServerProxy(
    { db: `sqlite:${t.dir}/proxy.db`, port: 0, apiPort: 0, stateDir: `${t.dir}/state` },
    { logger: pino({ level: 'silent' }), authorize: async (project, token) => (project === 'main' && token === TOKEN ? 'allow' : 'deny') },
  );
  const doc = {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'main' }],
      services: [service('outside', 'acme/outside', '/openai/v1'), service('inside', 'acme/inside', '/v1')],
    },
  };
  const r = await send(`${proxy.apiUrl!}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(doc),
  });
  expect(r.status, r.body.toString()).toBe(200);
});

afterAll(async () => {
  await proxy?.close();
  await replica?.close();
  t.cleanup();
});

const client = (): OpenAI => new OpenAI({ apiKey: TOKEN, baseURL: `${proxy.url}/proxy/models/main`, maxRetries: 0 });

it('a model whose prefix the allowlist refuses: 403 with its words, and no request reaches the replica', async () => {
  const err = await client()
    .chat.completions.create({ model: 'acme/outside', messages: [{ role: 'user', content: 'hi' }] })
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(PermissionDeniedError);
  expect((err as PermissionDeniedError).message).toBe('403 Path is not allowed for this service');
  expect(replica.received).toHaveLength(0);
  // The proxied path says the same.
  const proxied = await send(`${proxy.url}/proxy/services/main/outside/openai/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}` },
  });
  expect(proxied.status).toBe(403);
  expect(proxied.json()).toEqual({ detail: 'Path is not allowed for this service' });
});

it('a model under /v1/ is served', async () => {
  const completion = await client().chat.completions.create({ model: 'acme/inside', messages: [{ role: 'user', content: 'hi' }] });
  expect(completion.choices[0]?.message.content).toBe('Hello world');
  expect(replica.received.map((r) => r.url)).toEqual(['/v1/chat/completions']);
});
