// What the gateway's Nginx does with the forged replica answers the in-server proxy refuses
// (forged-response.test.ts): replica → direct → balancer socket → Nginx → client. The balancer
// relays bytes, so Nginx is the parser. Recorded here so a change in Nginx (or its config) that
// lets a replica split client connections shows up; README.md describes the behaviour.

import type { Server, Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gatewayDoc, putState, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/nginx.js';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { forgedOrReal, parseResponses, pipelined } from './forged-replica.js';

let replica: Server;
let t: TestGateway;
const replicaSockets = new Set<Socket>();

beforeAll(async () => {
  const scripted = await startScriptedReplica(forgedOrReal);
  replica = scripted.server;
  replica.on('connection', (s: Socket) => {
    replicaSockets.add(s);
    s.once('close', () => replicaSockets.delete(s));
  });
  t = await startTestGateway();
  const r = await putState(t, gatewayDoc([{ run: 'evil', ports: [scripted.port] }]));
  expect(r.status, r.body).toBe(200);
  await eventually(async () => {
    const text = await pipelined(t.httpPort, [request('/ready', true)]);
    return text.includes('real:/ready') ? true : undefined;
  }, 15_000);
}, 60_000);

afterAll(async () => {
  // The replica goes first: the gateway's shutdown need not wait for its connections to drain.
  for (const s of replicaSockets) s.destroy();
  await new Promise((r) => replica?.close(r));
  await t?.cleanup();
}, 120_000);

function request(target: string, last = false): string {
  return `GET ${target} HTTP/1.1\r\nHost: evil.gw.test\r\n${last ? 'Connection: close\r\n' : ''}\r\n`;
}

/** Nginx 1.22 (Debian 12's nginx-light), as observed: what the client gets for the forged answer. */
const NGINX: Record<string, { first: [number, string, string] | null }> = {
  // Chunked wins, the replica's Content-Length is dropped, Nginx re-chunks: the fake response is
  // body bytes of the first answer, not a second response.
  'te-cl': { first: [200, 'transfer-encoding', 'okHTTP/1.1 200 OK\r\nX-Smuggled: yes\r\nContent-Length: 17\r\n\r\n{"smuggled":"yes"}'] },
  'te-cl-long': { first: [200, 'transfer-encoding', 'ok'] },
  // The last Content-Length is taken (1.22 does not refuse two), relayed with that length.
  'two-cl': { first: [200, 'content-length', 'okHTTP/1.1 200 OK\r\nX-Smuggled: yes\r\nContent-Length: 17\r\n\r\n{"smuggled":"yes"}'] },
  // The declared length is relayed, the rest dropped.
  'longer-than-declared': { first: [200, 'content-length', 'ok'] },
  // Nothing at all: the client connection is closed.
  'bad-chunk': { first: null },
};

describe('Nginx in front of a forged replica answer never splits the client connection', () => {
  it.each(Object.keys(NGINX))('%s', async (name) => {
    const text = await pipelined(t.httpPort, [request(`/evil/${name}`), request('/next'), request('/last', true)]);
    const { responses, rest } = parseResponses(text);
    const want = NGINX[name]!.first;
    if (want === null) {
      expect(text).toBe('');
      return;
    }
    expect(rest).toBe('');
    // Exactly one answer per request, each pipelined request its own.
    expect(responses.map((r) => r.status)).toEqual([want[0], 200, 200]);
    expect(responses[0]!.headers.some(([k]) => k === want[1])).toBe(true);
    expect(responses[0]!.headers.filter(([k]) => k === 'content-length' || k === 'transfer-encoding')).toHaveLength(1);
    expect(responses[0]!.body).toBe(want[2]);
    expect(responses.slice(1).map((r) => r.body)).toEqual(['real:/next', 'real:/last']);
    expect(responses.some((r) => r.headers.some(([k]) => k === 'x-smuggled'))).toBe(false);
  });
});
