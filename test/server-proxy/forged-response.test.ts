// A replica that lies about the framing of its answer (scripted on raw TCP): both
// Transfer-Encoding and Content-Length, two different Content-Lengths, a bad chunk size, a body
// longer than it declared. The client gets a 502 (or, once the head went out, a closed
// connection), never the replica's framing headers, and never a response the replica smuggled
// in: pipelined requests on the same client connection get their own answers. On the raw fast
// path (HTTP/1.1) and on Node's handover path (HTTP/1.0 keep-alive), and on the model API.

import type { Server } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { forgedOrReal, parseResponses, pipelined, seen } from './forged-replica.js';
import { startPluginApp, type PluginApp } from './harness.js';

let replica: Server;
let proxy: PluginApp;

beforeAll(async () => {
  const scripted = await startScriptedReplica(forgedOrReal);
  replica = scripted.server;
  proxy = await startPluginApp(scripted.port, { clientMaxBodySize: 0 });
});

afterAll(async () => {
  await proxy?.app.close();
  await new Promise((r) => replica?.close(r));
});

const PATHS = {
  'the raw fast path': (target: string, last = false) =>
    `GET /proxy/services/p/r${target} HTTP/1.1\r\nHost: h\r\n${last ? 'Connection: close\r\n' : ''}\r\n`,
  "Node's handover path": (target: string, last = false) =>
    `GET /proxy/services/p/r${target} HTTP/1.0\r\nHost: h\r\n${last ? '' : 'Connection: keep-alive\r\n'}\r\n`,
};

describe.each(Object.entries(PATHS))('a forged replica answer on %s', (_path, request) => {
  it.each(['te-cl', 'te-cl-long', 'two-cl', 'longer-than-declared'])(
    '%s → 502; the pipelined requests after it get their own answers',
    async (name) => {
      const text = await pipelined(proxy.port, [request(`/evil/${name}`), request('/next'), request('/last', true)]);
      const { responses, rest } = parseResponses(text);
      expect(rest).toBe('');
      expect(responses.map((r) => r.status)).toEqual([502, 200, 200]);
      expect(JSON.parse(responses[0]!.body)).toEqual({ detail: 'Error requesting upstream' });
      expect(responses.map((r) => r.body).slice(1)).toEqual(['real:/next', 'real:/last']);
      expect(text).not.toContain('smuggled');
      // The connection that lied was closed: the requests after it came on others.
      const conn = (suffix: string): number | undefined => [...seen].reverse().find((r) => r.target.endsWith(suffix))?.conn;
      expect(conn('/next')).not.toBe(conn(`/evil/${name}`));
      expect(conn('/last')).not.toBe(conn(`/evil/${name}`));
    },
  );

  it('a bad chunk size after the head: the client connection is closed, nothing after it is answered from the replica', async () => {
    const text = await pipelined(proxy.port, [request('/evil/bad-chunk'), request('/next')]);
    const { responses } = parseResponses(text);
    // The head went out; its body never completes, and the connection ends there.
    expect(responses).toEqual([]);
    expect(text).not.toContain('smuggled');
    expect(text).not.toContain('real:/next');
  });

  it('an honest answer is framed by the proxy: one Content-Length, the one it counted, no Transfer-Encoding copied', async () => {
    const text = await pipelined(proxy.port, [request('/honest', true)]);
    const { responses } = parseResponses(text);
    expect(responses).toHaveLength(1);
    const lengths = responses[0]!.headers.filter(([k]) => k === 'content-length');
    expect(lengths).toEqual([['content-length', String('real:/honest'.length)]]);
    expect(responses[0]!.headers.some(([k]) => k === 'transfer-encoding')).toBe(false);
  });
});
