// The model API reading a replica that lies about its framing (scripted on raw TCP, through
// connectForwarder as the in-server model API does): both Transfer-Encoding and Content-Length,
// two Content-Lengths, a body longer than declared. The client gets a 502 in the OpenAI error
// shape, never the smuggled bytes, and the next call works on a fresh connection.

import type { Server } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { documentFor, startApi, type ApiHarness } from './fixtures.js';

const COMPLETION = JSON.stringify({
  id: 'c',
  object: 'chat.completion',
  created: 1,
  model: 'm',
  choices: [{ index: 0, message: { role: 'assistant', content: 'honest' }, finish_reason: 'stop' }],
});
const SMUGGLED = 'HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n{"smuggled":"yes"}\n';
const FORGED: Record<string, string> = {
  'te-cl': `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${COMPLETION.length}\r\nTransfer-Encoding: chunked\r\n\r\n${(COMPLETION.length + SMUGGLED.length).toString(16)}\r\n${COMPLETION}${SMUGGLED}\r\n0\r\n\r\n`,
  'two-cl': `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${COMPLETION.length}\r\nContent-Length: ${COMPLETION.length + SMUGGLED.length}\r\n\r\n${COMPLETION}${SMUGGLED}`,
  'longer-than-declared': `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${COMPLETION.length}\r\n\r\n${COMPLETION}${SMUGGLED}`,
};

let forged: string | null = null;
let replica: Server;
let api: ApiHarness;

beforeAll(async () => {
  const scripted = await startScriptedReplica((socket) => {
    socket.write(
      forged ?? `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${COMPLETION.length}\r\n\r\n${COMPLETION}`,
    );
  });
  replica = scripted.server;
  api = await startApi(documentFor({ openai: scripted.port, tgi: scripted.port }));
});

afterAll(async () => {
  await api?.close();
  await new Promise((r) => replica?.close(r));
});

const chat = async (): Promise<{ status: number; body: string }> => {
  const res = await fetch(`${api.baseUrl}/api/models/main/chat/completions`, {
    method: 'POST',
    headers: { authorization: 'Bearer good', 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'org/oa-model', messages: [{ role: 'user', content: 'Hi' }] }),
  });
  return { status: res.status, body: await res.text() };
};

it.each(Object.keys(FORGED))('%s → 502 in the OpenAI error shape, nothing smuggled; the next call is answered honestly', async (name) => {
  forged = FORGED[name]!;
  const r = await chat();
  expect(r.status).toBe(502);
  expect(JSON.parse(r.body)).toMatchObject({ error: { type: expect.any(String) } });
  expect(r.body).not.toContain('smuggled');
  forged = null;
  const next = await chat();
  expect(next.status).toBe(200);
  expect(JSON.parse(next.body)).toMatchObject({ choices: [{ message: { content: 'honest' } }] });
});
