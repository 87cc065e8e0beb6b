// The model API never hands an OpenAI client an HTML page: on the gateway, with the real Nginx,
// a model whose site is not live yet (the internal listener answers 404 HTML for a Host it has no
// site for) and a
// model whose replicas are all unready get a JSON 503 in the OpenAI error shape, as the official
// `openai` SDK reads it. The site is kept from going live by a read-only bind mount over the sites
// directory (root only; skipped without).

import { execFileSync, spawnSync } from 'node:child_process';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, send, type TestGateway } from '../helpers/gateway.js';
import { TEST_KEY_A } from '../helpers/keys.js';
import { eventually } from '../helpers/nginx.js';
import { freePort } from '../helpers/ports.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import {
  directReplica,
  integrationDoc,
  startControlServer,
  startGatewayWith,
  type ControlServer,
  type ServiceDoc,
} from './integration-harness.js';

const MEMBER = 'model-member-token-0456';
const root = process.getuid?.() === 0;

let server: ControlServer;
let replica: Replica;
let t: TestGateway;
let deadSsh: number;
const mounts: string[] = [];

const served: ServiceDoc = {
  run: 'live',
  domain: 'live.gw.test',
  model: { name: 'acme/live', format: 'openai', prefix: '/v1' },
  replicas: [directReplica('live-r0', 0)],
};
/** An SSH replica whose sshd does not exist: never Ready. */
const unready = (): ServiceDoc => ({
  run: 'down',
  domain: 'down.gw.test',
  model: { name: 'acme/down', format: 'openai', prefix: '/v1' },
  replicas: [{ id: 'down-r0', appPort: 8000, ssh: { host: '127.0.0.1', port: deadSsh, user: 'nobody' } }],
});
const notLive: ServiceDoc = {
  run: 'pending',
  domain: 'pending.gw.test',
  model: { name: 'acme/pending', format: 'openai', prefix: '/v1' },
  replicas: [directReplica('pending-r0', 0)],
};

const client = (): OpenAI => new OpenAI({ apiKey: MEMBER, baseURL: `http://127.0.0.1:${t.apiPort}/api/models/main`, maxRetries: 0 });

async function chatError(model: string): Promise<InstanceType<typeof OpenAI.APIError>> {
  const err = await client()
    .chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] })
    .catch((e: unknown) => e);
  expect(err).toBeInstanceOf(OpenAI.APIError);
  return err as InstanceType<typeof OpenAI.APIError>;
}

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  replica = await startOpenAIReplica();
  deadSsh = await freePort();
  served.replicas = [directReplica('live-r0', replica.port)];
  notLive.replicas = [directReplica('pending-r0', replica.port)];
  t = await startGatewayWith({ serverUrl: server.url });
  const r = await putState(t, integrationDoc({ sshPrivateKey: TEST_KEY_A, services: [served, unready()] }));
  expect(r.status).toBe(200);
}, 60_000);

afterAll(async () => {
  for (const m of mounts.reverse()) spawnSync('umount', ['-l', m]);
  await t?.cleanup();
  await replica?.close();
  await server?.close();
});

describe('the model API on the gateway answers JSON, never an HTML page', () => {
  it('a served model answers (the path works)', async () => {
    const done = await client().chat.completions.create({ model: 'acme/live', messages: [{ role: 'user', content: 'hi' }] });
    expect(done.choices[0]?.message.content).toBeTruthy();
  });

  it('a model whose replicas are all unready: 503 in the OpenAI error shape', async () => {
    const err = await chatError('acme/down');
    expect(err.status).toBe(503);
    expect(err.error).toMatchObject({ message: expect.any(String), type: 'upstream_error', code: 503 });
    expect(err.message).not.toMatch(/<html|<body|<center/i);
  });

  it.skipIf(!root)(
    'a model whose site is not live yet: 503 in the OpenAI error shape, not Nginx 404 HTML',
    async () => {
      const sites = t.gw.paths.confDir;
      execFileSync('mount', ['--bind', sites, sites]);
      mounts.push(sites);
      execFileSync('mount', ['-o', 'remount,bind,ro', sites]);
      const r = await putState(t, integrationDoc({ sshPrivateKey: TEST_KEY_A, services: [served, unready(), notLive] }));
      expect(r.status).toBe(200);
      // Its public host is served by Host through our default server already; the model API goes
      // through the internal listener, where only the site serves it (its default server: 404 HTML).
      const raw = await send({ port: t.httpPort, method: 'POST', path: '/v1/chat/completions', host: notLive.domain, body: '{}' });
      expect(raw.status).toBe(200);
      const err = await chatError('acme/pending');
      expect(err.status).toBe(503);
      expect(err.error).toMatchObject({ message: expect.stringMatching(/not live/), type: 'upstream_error', code: 503 });
      expect(JSON.stringify(err.error)).not.toMatch(/<html|<body|<center|nginx/i);

      // Once the sites can be written, the same model answers.
      execFileSync('umount', [sites]);
      mounts.pop();
      await t.gw.controller.reconcileAll();
      await eventually(async () => {
        const ok = await client()
          .chat.completions.create({ model: 'acme/pending', messages: [{ role: 'user', content: 'hi' }] })
          .catch(() => undefined);
        return ok ? true : undefined;
      }, 20_000);
    },
    60_000,
  );
});
