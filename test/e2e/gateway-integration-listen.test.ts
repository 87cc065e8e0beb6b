// The gateway with Nginx on a specific listen address (--listen-host ::1): the sites listen there
// only, and the gateway's own model calls reach them on the internal listener (regressions: the
// forwarder used to build `http://::1:<port>` and throw; then an auth: true model answered 401
// through the model API because the call did not come from 127.0.0.1).

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import { call, directReplica, integrationDoc, startControlServer, startGatewayWith, type ControlServer } from './integration-harness.js';

const MEMBER = 'ipv6-member-token-0123';
const MODEL = 'acme/Open-Model';

let server: ControlServer;
let replica: Replica;
let t: TestGateway;

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  replica = await startOpenAIReplica();
  t = await startGatewayWith({ listenHost: '::1', serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        run: 'open',
        domain: 'open.gw.test',
        auth: true,
        model: { name: MODEL, format: 'openai' },
        replicas: [directReplica('open-r0', replica.port)],
      },
    ],
  });
  expect((await putState(t, doc)).status).toBe(200);
});

afterAll(async () => {
  await t?.cleanup();
  await replica?.close();
  await server?.close();
});

describe('--listen-host ::1', () => {
  it('serves the sites on ::1 only: no extra loopback listener for the gateway itself', async () => {
    await expect(call({ port: t.httpPort, host: 'open.gw.test', path: '/v1/models' })).rejects.toMatchObject({ code: 'ECONNREFUSED' });
  });

  it('forwards model calls of an auth: true service through its own Nginx', async () => {
    const client = new OpenAI({ apiKey: MEMBER, baseURL: `http://127.0.0.1:${t.apiPort}/api/models/main`, maxRetries: 0 });
    const completion = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }] });
    expect(completion.choices[0]?.message.content).toBe('Hello world');
    expect(replica.received.at(-1)?.headers.host).toBe('open.gw.test');
  });
});
