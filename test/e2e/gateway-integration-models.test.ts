// The OpenAI-compatible model API end to end with the official `openai` SDK: on the gateway API
// (`/api/models/<project>`) and through an entrypoint domain served by Nginx. Chat calls go
// through our own Nginx with the service's Host to an OpenAI-format replica, and count in
// /api/stats/collect like any other request.

import type { LookupAddress } from 'node:dns';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch, type RequestInit as UndiciRequestInit } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import {
  call,
  directReplica,
  integrationDoc,
  requestsIn30s,
  startControlServer,
  startGatewayWith,
  type ControlServer,
} from './integration-harness.js';

const MEMBER = 'model-member-token-0123';
const MODEL = 'acme/Llama-Test-8B';
const SERVICE_DOMAIN = 'llm.gw.test';
const ENTRYPOINT = 'api.gw.test';

let server: ControlServer;
let replica: Replica;
let t: TestGateway;
/** Every name resolves to 127.0.0.1: the SDK keeps the entrypoint domain in its URLs and Host. */
const loopback = new Agent({
  connect: {
    lookup: (
      _host: string,
      opts: { all?: boolean },
      cb: (err: Error | null, address: string | LookupAddress[], family?: number) => void,
    ) => {
      if (opts.all) cb(null, [{ address: '127.0.0.1', family: 4 }]);
      else cb(null, '127.0.0.1', 4);
    },
  },
});

const viaLoopback = ((input: string | URL | Request, init?: RequestInit) =>
  undiciFetch(input instanceof Request ? input.url : input, {
    ...(init as UndiciRequestInit),
    dispatcher: loopback,
  })) as unknown as typeof fetch;

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  replica = await startOpenAIReplica();
  t = await startGatewayWith({ serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        run: 'llm',
        domain: SERVICE_DOMAIN,
        auth: true,
        model: { name: MODEL, format: 'openai', prefix: '/v1' },
        replicas: [directReplica('llm-r0', replica.port)],
      },
    ],
    entrypoints: [{ domain: ENTRYPOINT }],
  });
  const r = await putState(t, doc);
  expect(r.status).toBe(200);
});

afterAll(async () => {
  await t?.cleanup();
  await replica?.close();
  await server?.close();
  await loopback.close();
});

const WAYS = ['the gateway API', 'the entrypoint domain'] as const;
type Way = (typeof WAYS)[number];

/** An SDK client on the gateway API, or on the entrypoint domain through Nginx. */
function client(way: Way): OpenAI {
  return way === 'the gateway API'
    ? new OpenAI({ apiKey: MEMBER, baseURL: `http://127.0.0.1:${t.apiPort}/api/models/main`, maxRetries: 0 })
    : new OpenAI({ apiKey: MEMBER, baseURL: `http://${ENTRYPOINT}:${t.httpPort}/`, maxRetries: 0, fetch: viaLoopback });
}

describe('the model API with the openai SDK', () => {
  it.each(WAYS)('lists the project model on %s', async (way) => {
    const page = await client(way).models.list();
    expect(page.data.map((m) => m.id)).toEqual([MODEL]);
    expect(page.data[0]).toMatchObject({ object: 'model', owned_by: 'main' });
  });

  it.each(WAYS)('completes a chat without streaming on %s', async (way) => {
    const before = replica.received.length;
    const completion = await client(way).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }] });
    expect(completion.choices[0]?.message.content).toBe('Hello world');
    expect(completion.usage?.total_tokens).toBe(5);
    const got = replica.received[before]!;
    expect(got.url).toBe('/v1/chat/completions');
    expect(got.headers.host).toBe(SERVICE_DOMAIN);
    expect(got.headers.authorization).toBeUndefined();
    expect((JSON.parse(got.body) as { model: string }).model).toBe(MODEL);
  });

  it.each(WAYS)('streams a chat on %s', async (way) => {
    const stream = await client(way).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }], stream: true });
    let text = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe('Hello world');
    expect(finish).toBe('stop');
  });

  it('refuses a token that is not a member', async () => {
    for (const way of WAYS) {
      const bad = client(way).withOptions({ apiKey: 'not-a-member-token-01' });
      await expect(bad.models.list()).rejects.toMatchObject({ status: 403 });
    }
  });

  it('counts the chat requests for the model service in /api/stats/collect', async () => {
    // Two non-streaming and two streaming completions above, and nothing else reached the replica.
    const chats = replica.received.filter((r) => r.url === '/v1/chat/completions').length;
    expect(chats).toBe(4);
    const counted = await eventually(async () => ((await requestsIn30s(t, 'main', 'llm')) === chats ? chats : undefined), 30_000);
    expect(counted).toBe(4);
  });

  it('serves the entrypoint site only under its own domain', async () => {
    const r = await call({ port: t.httpPort, host: 'unknown.gw.test', path: '/models' });
    expect(r.status).toBe(404);
  });
});
