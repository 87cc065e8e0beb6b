// The gateway's model API (`/api/models/<project>/chat/completions` on the gateway API, forwarding
// through the real private Nginx to OpenAI- and TGI-format replicas) under clients that hang up
// at random points: mid-head, mid-body (fixed length and chunked), mid-response (streamed and
// whole answers). Each cut fails that request alone: the gateway stays up and answers normally.
// The run prints its seed; DP_FUZZ_SEED=<seed> replays it.

import { connect as netConnect, type Socket } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { directReplica, integrationDoc, startControlServer, startGatewayWith, type ControlServer } from '../e2e/integration-harness.js';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { CHATML } from './fixtures.js';
import { startOpenAIReplica, startTgiReplica, type Replica } from './replicas.js';
import { prng } from '../helpers/prng.js';

const MEMBER = 'disconnect-member-token-0123';
let server: ControlServer;
let oa: Replica;
let tgi: Replica;
let t: TestGateway;

beforeAll(async () => {
  server = await startControlServer({ main: [MEMBER] });
  oa = await startOpenAIReplica();
  tgi = await startTgiReplica();
  t = await startGatewayWith({ serverUrl: server.url });
  const doc = integrationDoc({
    services: [
      {
        run: 'oa',
        domain: 'oa.gw.test',
        auth: true,
        model: { name: 'oa-model', format: 'openai', prefix: '/v1' },
        replicas: [directReplica('oa-0', oa.port)],
      },
      { run: 'tg', domain: 'tg.gw.test', auth: true, replicas: [directReplica('tg-0', tgi.port)] },
    ],
  }) as { spec: { services: Record<string, unknown>[] } };
  doc.spec.services[1]!.model = { name: 'tgi-model', format: 'tgi', chatTemplate: CHATML, eosToken: '<|im_end|>' };
  const r = await putState(t, doc);
  expect(r.status, r.body).toBe(200);
  await eventually(async () => ((await chat('oa-model', false)).status === 200 ? true : undefined), 15_000);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await oa?.close();
  await tgi?.close();
  await server?.close();
});

/** One whole chat call on its own connection: status and body. */
async function chat(model: string, stream: boolean): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${t.apiPort}/api/models/main/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${MEMBER}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'Hi' }], stream }),
  });
  return { status: res.status, body: await res.text() };
}

async function answersNormally(): Promise<void> {
  for (const model of ['oa-model', 'tgi-model']) {
    const whole = await chat(model, false);
    expect(whole.status, whole.body).toBe(200);
    expect(JSON.stringify(JSON.parse(whole.body))).toMatch(/Hello/);
    const streamed = await chat(model, true);
    expect(streamed.status).toBe(200);
    expect(streamed.body).toMatch(/data: \[DONE\]/);
  }
}

type Cut = 'head' | 'body' | 'response' | 'none';

async function randomRequest(rand: () => number): Promise<{ cut: Cut; answered: boolean; what: string }> {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const cut = pick(['head', 'body', 'response', 'none'] as const);
  const chunked = rand() < 0.5;
  const model = pick(['oa-model', 'tgi-model', 'no-such-model']);
  const stream = rand() < 0.5;
  const body = Buffer.from(
    JSON.stringify({ model, messages: [{ role: 'user', content: 'Hi '.repeat(Math.floor(rand() * 2000)) }], stream }),
  );
  const head =
    `POST /api/models/main/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${MEMBER}\r\nContent-Type: application/json\r\n` +
    (chunked ? 'Transfer-Encoding: chunked\r\n\r\n' : `Content-Length: ${body.length}\r\n\r\n`);
  const framed = chunked ? Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n0\r\n\r\n')]) : body;

  const socket: Socket = netConnect(t.apiPort, '127.0.0.1');
  let received = '';
  socket.on('error', () => undefined);
  socket.on('data', (c: Buffer) => (received += c.toString('latin1')));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  await Promise.race([new Promise<void>((resolve) => socket.once('connect', () => resolve())), closed]);
  if (socket.destroyed) throw new Error('the gateway refused the connection');
  const hangUp = (): void => {
    if (rand() < 0.5) socket.resetAndDestroy();
    else socket.destroy();
  };
  const status = (): boolean => /^HTTP\/1\.1 \d{3} /.test(received);
  if (cut === 'head') {
    socket.write(head.slice(0, 1 + Math.floor(rand() * (head.length - 1))));
    if (rand() < 0.5) await new Promise((r) => setImmediate(r));
    hangUp();
  } else {
    socket.write(head);
    if (cut === 'body') {
      socket.write(framed.subarray(0, Math.floor(rand() * framed.length)));
      if (rand() < 0.5) await new Promise((r) => setTimeout(r, Math.floor(rand() * 5)));
      hangUp();
    } else {
      socket.write(framed);
      const until = cut === 'response' ? () => received.length > 0 : status;
      await Promise.race([eventually(() => (until() ? true : undefined), 15_000), closed]).catch(() => undefined);
      if (cut === 'response') hangUp();
      else socket.destroy();
    }
  }
  await closed;
  return {
    cut,
    answered: status(),
    what: `${cut} ${chunked ? 'chunked' : 'fixed'} ${model} stream=${stream}: ${JSON.stringify(received.slice(0, 200))}`,
  };
}

it('1,000 model API requests cut at random points: the gateway stays up and answers normally', async () => {
  const seed = Number(process.env.DP_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`model API disconnect fuzz seed: ${seed} (DP_FUZZ_SEED=${seed} replays it)`);
  const rand = prng(seed);
  let next = 0;
  const unanswered: string[] = [];
  const worker = async (): Promise<void> => {
    while (next < 1000) {
      next++;
      const r = await randomRequest(rand);
      if (r.cut === 'none' && !r.answered) unanswered.push(r.what);
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
  expect(unanswered, `seed ${seed}`).toEqual([]);
  await answersNormally();
}, 300_000);
