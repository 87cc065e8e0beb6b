// The model API end to end with the official OpenAI SDK as the client, over stand-in replicas
// reached through replicaForwarder over a real data plane (TCP to the replica; the gateway's Nginx path is in
// nginx-forwarder.test.ts).

import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createControlServerAuth } from '../../src/auth/index.js';
import { replicaForwarder } from '../../src/models/forwarders.js';
import { replicasOf } from '../helpers/replicas.js';
import { freePort } from '../helpers/ports.js';
import { documentFor, startApi, type ApiHarness } from './fixtures.js';
import { Gate, openaiChunk, sse, startOpenAIReplica, startTgiReplica, tgiToken, type Replica } from './replicas.js';

let oa: Replica;
let tgi: Replica;
let api: ApiHarness;
let gate: Gate | undefined;

beforeAll(async () => {
  oa = await startOpenAIReplica(() => gate);
  tgi = await startTgiReplica(() => gate);
  api = await startApi(documentFor({ openai: oa.port, tgi: tgi.port }));
});
afterAll(async () => {
  await api.close();
  await oa.close();
  await tgi.close();
});
afterEach(() => {
  gate?.release();
  gate = undefined;
  oa.next.length = 0;
  tgi.next.length = 0;
});

const user = [{ role: 'user' as const, content: 'Hi' }];

describe('models', () => {
  it('lists the project’s models by name with a stable created time and the project as owner', async () => {
    const page = await api.client().models.list();
    expect(page.data).toEqual([
      { object: 'model', id: 'a-idle-model', created: 1735689600, owned_by: 'main' },
      { object: 'model', id: 'org/oa-model', created: 1735689600, owned_by: 'main' },
      { object: 'model', id: 'tgi-model', created: 1735689600, owned_by: 'main' },
    ]);
  });

  it('gets one model, ids with a slash included; an unknown one is NotFound', async () => {
    const m = await api.client().models.retrieve('org/oa-model');
    expect(m).toEqual({ object: 'model', id: 'org/oa-model', created: 1735689600, owned_by: 'main' });
    await expect(api.client().models.retrieve('nope')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('an empty project lists nothing', async () => {
    const res = await fetch(`${api.baseUrl}/api/models/other/models`, { headers: { authorization: 'Bearer good' } });
    expect(((await res.json()) as { data: { id: string }[] }).data.map((d) => d.id)).toEqual(['other-model']);
  });
});

describe('auth', () => {
  it('a wrong token is PermissionDenied for list and create', async () => {
    await expect(api.client('bad').models.list()).rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
    await expect(api.client('bad').chat.completions.create({ model: 'org/oa-model', messages: user })).rejects.toBeInstanceOf(
      OpenAI.PermissionDeniedError,
    );
  });

  it.each([[undefined], ['Bearer '], ['Bearer'], ['']])('Authorization %j → 403 before any lookup', async (header) => {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (header !== undefined) headers.authorization = header;
    for (const [method, path] of [
      ['GET', 'models'],
      ['POST', 'chat/completions'],
      ['GET', 'models/nope'],
    ] as const) {
      const res = await fetch(`${api.baseUrl}/api/models/main/${path}`, {
        method,
        headers,
        body: method === 'POST' ? '{"model":"x","messages":[]}' : undefined,
      });
      expect(res.status).toBe(403);
      expect(await res.json()).toEqual({
        detail: 'Unauthenticated or unauthorized to access project main',
        error: { message: 'Unauthenticated or unauthorized to access project main', type: 'permission_error', code: 403 },
      });
    }
  });

  it('an unknown project is 403, not 404', async () => {
    await expect(api.client('good', 'ghost').models.list()).rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
  });

  it('is denied when the control server cannot answer', async () => {
    const auth = createControlServerAuth({ serverUrl: `http://127.0.0.1:${await freePort()}`, timeoutMs: 2000 });
    const down = await startApi(api.state.current, { authorize: (p, t) => auth.check(p, t) });
    try {
      await expect(down.client('good').models.list()).rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
    } finally {
      await down.close();
      await auth.close();
    }
  });

  it('answers CORS preflights without a token', async () => {
    const res = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
      method: 'OPTIONS',
      headers: {
        origin: 'https://app.example',
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization,content-type',
      },
    });
    expect(res.status).toBe(204);
    expect(res.headers.get('access-control-allow-origin')).toBe('*');
    expect(res.headers.get('access-control-allow-headers')).toBe('authorization,content-type');
  });
});

describe('openai format', () => {
  it('forwards the client’s JSON as sent to <prefix>/chat/completions and relays the answer', async () => {
    const before = oa.received.length;
    const res = await api.client().chat.completions.create({
      model: 'org/oa-model',
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'Hi' }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 't', type: 'function', function: { name: 'f', arguments: '{}' } }] },
      ],
      max_completion_tokens: 5,
      logprobs: true,
      parallel_tool_calls: false,
      tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    });
    expect(res.choices[0]!.message.content).toBe('Hello world');
    expect(res.usage).toEqual({ prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 });
    const got = oa.received[before]!;
    expect(got.method).toBe('POST');
    expect(got.url).toBe('/v1/chat/completions');
    expect(got.headers.authorization).toBeUndefined();
    expect(JSON.parse(got.body)).toEqual({
      model: 'org/oa-model',
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'Hi' }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 't', type: 'function', function: { name: 'f', arguments: '{}' } }] },
      ],
      max_completion_tokens: 5,
      logprobs: true,
      parallel_tool_calls: false,
      tools: [{ type: 'function', function: { name: 'f', parameters: {} } }],
    });
  });

  it('streams chunk by chunk: the first chunk reaches the client while the replica holds the stream', async () => {
    gate = new Gate();
    const g = gate;
    const stream = await api
      .client()
      .chat.completions.create({ model: 'org/oa-model', messages: user, stream: true, stream_options: { include_usage: true } });
    const parts: string[] = [];
    let firstBeforeRelease: boolean | undefined;
    for await (const chunk of stream) {
      if (firstBeforeRelease === undefined) {
        firstBeforeRelease = !g.released;
        g.release();
      }
      parts.push(chunk.choices[0]?.delta.content ?? '');
    }
    expect(firstBeforeRelease).toBe(true);
    expect(parts.join('')).toBe('Hello world');
    expect(JSON.parse(oa.received.at(-1)!.body)).toMatchObject({ stream: true, stream_options: { include_usage: true } });
  });

  it('a replica error before the first byte keeps its status, with the replica’s message', async () => {
    oa.next.push((_req, _body, res) => {
      res
        .writeHead(400, { 'content-type': 'application/json' })
        .end(JSON.stringify({ object: 'error', message: 'bad thing', type: 'BadRequestError', code: 400 }));
    });
    const err = await api
      .client()
      .chat.completions.create({ model: 'org/oa-model', messages: user })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.APIError>).message).toBe('400 bad thing');
  });

  it('an error after the stream started reaches the SDK as an error', async () => {
    const cut = new Gate();
    oa.next.push(async (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      sse(res, openaiChunk('Hel'));
      await cut.wait();
      res.destroy();
    });
    const stream = await api.client().chat.completions.create({ model: 'org/oa-model', messages: user, stream: true });
    const seen: string[] = [];
    const err = await (async () => {
      for await (const c of stream) {
        seen.push(c.choices[0]?.delta.content ?? '');
        cut.release();
      }
    })().catch((e: unknown) => e);
    expect(seen).toEqual(['Hel']);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as Error).message).toMatch(/Error requesting model/);
  });

  it('a client that goes away closes the replica connection, before the answer and mid-stream', async () => {
    for (const stream of [false, true]) {
      const asked = new Gate();
      const closed = new Gate();
      oa.next.push((_req, _body, res) => {
        res.on('close', () => closed.release());
        if (stream) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          sse(res, openaiChunk('Hel'));
        }
        asked.release();
        // …and never finishes: only the client going away ends this exchange.
      });
      const client = new AbortController();
      const pending = fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
        method: 'POST',
        headers: { authorization: 'Bearer good', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'org/oa-model', messages: user, stream }),
        signal: client.signal,
      });
      await asked.wait();
      if (stream) {
        const reader = (await pending).body!.getReader();
        expect(new TextDecoder().decode((await reader.read()).value)).toContain('Hel');
      } else pending.catch(() => undefined);
      client.abort();
      await closed.wait();
      expect(closed.released).toBe(true);
    }
  });

  it('a small answer cut short is a 502, not a truncated 200', async () => {
    oa.next.push((_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"id":"chatcmpl-up",');
      setTimeout(() => res.destroy(), 20);
    });
    const res = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer good', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'org/oa-model', messages: user }),
    });
    expect(res.status).toBe(502);
    expect(await res.json()).toMatchObject({ error: { type: 'upstream_error', code: 502 } });
  });

  it('a model with no replicas is 503, an unknown model 404, an unreachable replica 502', async () => {
    const e503 = await api
      .client()
      .chat.completions.create({ model: 'a-idle-model', messages: user })
      .catch((e: unknown) => e);
    expect((e503 as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
    await expect(api.client().chat.completions.create({ model: 'nope', messages: user })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    const dead = await freePort();
    const broken = await startApi(documentFor({ openai: dead, tgi: dead }));
    try {
      const e502 = await broken
        .client()
        .chat.completions.create({ model: 'org/oa-model', messages: user })
        .catch((e: unknown) => e);
      expect((e502 as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    } finally {
      await broken.close();
    }
  });

  it('a data plane with no Ready replica gives its 503 to the client', async () => {
    const down = replicasOf({ 'main/oa': [{ isReady: () => false, open: () => Promise.reject(new Error('never opened')) }] });
    const none = replicaForwarder(down);
    const h = await startApi(api.state.current, { forwarder: none });
    try {
      const err = await h
        .client()
        .chat.completions.create({ model: 'org/oa-model', messages: user })
        .catch((e: unknown) => e);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
      expect((err as Error).message).toBe('503 Service main/oa has no ready replica');
    } finally {
      await h.close();
      await down.close();
    }
  });

  it('an invalid body is 422 naming the field', async () => {
    const res = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer good', 'content-type': 'application/json' },
      body: '{"messages":[]}',
    });
    expect(res.status).toBe(422);
    expect(((await res.json()) as { detail: string }).detail).toMatch(/model/);
    const bad = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer good' },
      body: '{',
    });
    expect(bad.status).toBe(422);
  });
});

describe('tgi format', () => {
  it('renders the template, maps parameters and converts the answer', async () => {
    const before = tgi.received.length;
    const res = await api.client().chat.completions.create({
      model: 'tgi-model',
      messages: [{ role: 'system', content: 'Be brief.' }, ...user],
      max_tokens: 20,
      temperature: 0.7,
      top_p: 0.95,
      seed: 3,
      stop: ['###'],
    });
    expect(res.object).toBe('chat.completion');
    expect(res.model).toBe('tgi-model');
    expect(res.choices).toEqual([
      { index: 0, message: { role: 'assistant', content: 'Hello there' }, logprobs: null, finish_reason: 'stop' },
    ]);
    expect(res.usage).toEqual({ prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 });
    expect(res.system_fingerprint).toBe('fp_11');
    const got = tgi.received[before]!;
    expect(got.url).toBe('/generate');
    expect(JSON.parse(got.body)).toEqual({
      inputs: '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
      parameters: {
        do_sample: true,
        max_new_tokens: 20,
        stop: ['###', '<|im_end|>'],
        seed: 3,
        temperature: 0.7,
        best_of: 1,
        details: true,
        decoder_input_details: true,
        top_p: 0.95,
      },
    });
  });

  it('streams one chunk per token while the replica holds the stream, with usage and [DONE]', async () => {
    gate = new Gate();
    const g = gate;
    const stream = await api
      .client()
      .chat.completions.create({ model: 'tgi-model', messages: user, stream: true, stream_options: { include_usage: true } });
    const contents: string[] = [];
    let finish: string | null | undefined;
    let usage: unknown;
    let firstBeforeRelease: boolean | undefined;
    for await (const chunk of stream) {
      if (firstBeforeRelease === undefined) {
        firstBeforeRelease = !g.released;
        g.release();
      }
      const c = chunk.choices[0];
      if (c?.delta.content) contents.push(c.delta.content);
      if (c?.finish_reason) finish = c.finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(firstBeforeRelease).toBe(true);
    expect(contents).toEqual(['Hello', ' there']);
    expect(finish).toBe('stop');
    expect(usage).toEqual({ prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 });
    const got = tgi.received.at(-1)!;
    expect(got.url).toBe('/generate_stream');
    expect(JSON.parse(got.body).parameters.decoder_input_details).toBe(false);
  });

  it('frames the stream as OpenAI does', async () => {
    const res = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer good', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tgi-model', messages: user, stream: true }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('x-accel-buffering')).toBe('no');
    const text = await res.text();
    const events = text.split('\n\n');
    expect(events.at(-1)).toBe('');
    expect(events.at(-2)).toBe('data: [DONE]');
    expect(events.slice(0, -2).every((e) => e.startsWith('data: {'))).toBe(true);
  });

  it('a TGI error event mid-stream reaches the SDK as an error; before the first token it is an HTTP error', async () => {
    tgi.next.push((_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      sse(res, tgiToken('Hel'));
      sse(res, { error: 'Request failed during generation: oom', error_type: 'generation' });
      res.end();
    });
    const stream = await api.client().chat.completions.create({ model: 'tgi-model', messages: user, stream: true });
    const err = await (async () => {
      for await (const _c of stream) void _c;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as Error).message).toBe('Request failed during generation: oom');

    tgi.next.push((_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      sse(res, { error: 'Input validation error: too long', error_type: 'validation' });
      res.end();
    });
    const early = await api
      .client()
      .chat.completions.create({ model: 'tgi-model', messages: user, stream: true })
      .catch((e: unknown) => e);
    expect(early).toBeInstanceOf(OpenAI.UnprocessableEntityError);
  });

  it('a stream cut before the final event ends with an error, not a silent truncation', async () => {
    tgi.next.push((_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      sse(res, tgiToken('Hel'));
      res.end();
    });
    const stream = await api.client().chat.completions.create({ model: 'tgi-model', messages: user, stream: true });
    const err = await (async () => {
      for await (const _c of stream) void _c;
    })().catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/ended before its final event/);
  });

  it('a template error is a 400 with Jinja’s message', async () => {
    const harness = await startApi(documentFor({ openai: oa.port, tgi: tgi.port }, "{{ raise_exception('no system role here') }}"));
    try {
      const err = await harness
        .client()
        .chat.completions.create({ model: 'tgi-model', messages: user })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as Error).message).toBe('400 Failed to render chat template: no system role here');
    } finally {
      await harness.close();
    }
  });

  it('a TGI 422 before the first byte keeps its status', async () => {
    tgi.next.push((_req, _body, res) => {
      res
        .writeHead(422, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: 'Input validation error', error_type: 'validation' }));
    });
    const err = await api
      .client()
      .chat.completions.create({ model: 'tgi-model', messages: user })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect((err as Error).message).toBe('422 Input validation error');
  });
});
