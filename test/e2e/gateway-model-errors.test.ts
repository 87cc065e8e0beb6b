// A refusal on the way to a model, as the official `openai` SDK and dstack's clients read it
// from the gateway's model API: the words of whoever refused (the router allowlist in the
// service's Nginx site, or the replica itself), once, as a string — `detail` for dstack's
// clients, `error.message` for the SDK — never the upstream's JSON body wrapped in a string.

import OpenAI, { PermissionDeniedError, UnprocessableEntityError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, siteServed, type TestGateway } from '../helpers/gateway.js';
import { startOpenAIReplica, type Replica } from '../models/replicas.js';
import { directReplica, integrationDoc, startControlServer, startGatewayWith, type ControlServer } from './integration-harness.js';

const MEMBER = 'model-member-token-0123';
const ROUTED = 'acme/Routed-8B';
const PLAIN = 'acme/Plain-8B';

let server: ControlServer;
let replica: Replica;
let t: TestGateway;

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  replica = await startOpenAIReplica();
  t = await startGatewayWith({ serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        // Its model lives under /openai/v1, which the router allowlist does not let through.
        run: 'routed',
        domain: 'routed.gw.test',
        auth: true,
        model: { name: ROUTED, format: 'openai', prefix: '/openai/v1' },
        replicas: [directReplica('routed-r0', replica.port)],
      },
      {
        run: 'plain',
        domain: 'plain.gw.test',
        auth: true,
        model: { name: PLAIN, format: 'openai', prefix: '/v1' },
        replicas: [directReplica('plain-r0', replica.port)],
      },
    ],
  }) as { spec: { services: Record<string, unknown>[] } };
  doc.spec.services[0]!.routerAllowlist = true;
  const r = await putState(t, doc);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  await siteServed(t, 'routed.gw.test');
  await siteServed(t, 'plain.gw.test');
});

afterAll(async () => {
  await t?.cleanup();
  await replica?.close();
  await server?.close();
});

const client = (): OpenAI => new OpenAI({ apiKey: MEMBER, baseURL: `http://127.0.0.1:${t.apiPort}/api/models/main`, maxRetries: 0 });

/** The same call with fetch, for the body as it is on the wire. */
async function rawChat(model: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await fetch(`http://127.0.0.1:${t.apiPort}/api/models/main/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${MEMBER}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'Hi' }] }),
  });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

describe("a refusal through the gateway's model API", () => {
  it("the router allowlist's 403: the SDK's PermissionDeniedError says the plain sentence", async () => {
    const before = replica.received.length;
    const err = await client()
      .chat.completions.create({ model: ROUTED, messages: [{ role: 'user', content: 'Hi' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PermissionDeniedError);
    expect((err as PermissionDeniedError).status).toBe(403);
    expect((err as PermissionDeniedError).message).toBe('403 Path is not allowed for this service');
    expect((err as PermissionDeniedError).error).toMatchObject({
      message: 'Path is not allowed for this service',
      type: 'permission_error',
    });
    // Nginx refused it: the replica never saw the request.
    expect(replica.received.length).toBe(before);
    const raw = await rawChat(ROUTED);
    expect(raw).toEqual({
      status: 403,
      body: {
        detail: 'Path is not allowed for this service',
        error: { message: 'Path is not allowed for this service', type: 'permission_error', code: 403 },
      },
    });
  });

  it("a replica's own JSON error in dstack's shape: its detail once, as the message", async () => {
    for (let i = 0; i < 2; i++) {
      replica.next.push((_req, _body, res) => {
        res.writeHead(422, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ detail: 'prompt is longer than the context window' }));
      });
    }
    const err = await client()
      .chat.completions.create({ model: PLAIN, messages: [{ role: 'user', content: 'Hi' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnprocessableEntityError);
    expect((err as UnprocessableEntityError).message).toBe('422 prompt is longer than the context window');
    const raw = await rawChat(PLAIN);
    expect(raw.status).toBe(422);
    expect(raw.body.detail).toBe('prompt is longer than the context window');
    expect(raw.body.error).toMatchObject({ message: 'prompt is longer than the context window' });
  });
});
