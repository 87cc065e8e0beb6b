// What the gateway's Nginx does with the forged replica answers the in-server proxy refuses
// (forged-response.test.ts): replica → direct → balancer socket → Nginx → client. The balancer
// parses the replica's answer strictly and frames what it relays itself, so Nginx never sees
// the forged framing. Recorded here so a change (in the balancer, Nginx or its config) that lets
// a replica split client connections shows up; README.md describes the behaviour.

import type { Server, Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERRORS } from '../../src/errors.js';
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

/** The balancer's answer for a replica it cannot relay (the error catalog's 502). */
const REFUSED: [number, string, string] = [502, 'content-length', JSON.stringify({ detail: ERRORS.DP_ERR_UPSTREAM_FAILED.message })];

/** What the client gets for the forged answer; 'truncated': the head and body bytes before the bad framing, then the close. */
const NGINX: Record<string, { first: [number, string, string] | 'truncated' }> = {
  // Both framings, or two lengths: refused before any byte is relayed.
  'te-cl': { first: REFUSED },
  'te-cl-long': { first: REFUSED },
  'two-cl': { first: REFUSED },
  // More bytes than declared in the same read: refused before the head is relayed.
  'longer-than-declared': { first: REFUSED },
  // The bad chunk comes after a good one was relayed: the answer is cut there, the connection closed.
  'bad-chunk': { first: 'truncated' },
};

describe('Nginx in front of a forged replica answer never splits the client connection', () => {
  it.each(Object.keys(NGINX))('%s', async (name) => {
    const text = await pipelined(t.httpPort, [request(`/evil/${name}`), request('/next'), request('/last', true)]);
    const { responses, rest } = parseResponses(text);
    const want = NGINX[name]!.first;
    if (want === 'truncated') {
      expect(text.startsWith('HTTP/1.1 200 ')).toBe(true);
      expect(responses).toEqual([]);
      expect(text).not.toMatch(/x-smuggled/i);
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
