// A replica that lies about the framing of its answer (scripted on raw TCP): both
// Transfer-Encoding and Content-Length, two different Content-Lengths, a bad chunk size, a body
// longer than it declared. The client gets a 502 (or, once the head went out, a closed
// connection), never the replica's framing headers, and never a response the replica smuggled
// in: pipelined requests on the same client connection get their own answers. On the raw fast
// path (HTTP/1.1) and on Node's handover path (HTTP/1.0 keep-alive), and on the model API.

import type { Server, Socket } from 'node:net';
import { connect as netConnect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { startPluginApp, type PluginApp } from './harness.js';

const SMUGGLED = 'HTTP/1.1 200 OK\r\nX-Smuggled: yes\r\nContent-Length: 17\r\n\r\n{"smuggled":"yes"}';

/** Forged answers by name; `/evil/<name>` asks for one, anything else gets an honest answer. */
export const FORGED: Record<string, string> = {
  // The audit's payload: chunked framing says 'ok' + a whole fake response, the length says 2.
  'te-cl': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n${(2 + SMUGGLED.length).toString(16)}\r\nok${SMUGGLED}\r\n0\r\n\r\n`,
  'te-cl-long': 'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  'two-cl': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: ${2 + SMUGGLED.length}\r\n\r\nok${SMUGGLED}`,
  'bad-chunk': `HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n${SMUGGLED}`,
  'longer-than-declared': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok${SMUGGLED}`,
};

/** Each request the replica got: its target and the connection it came on. */
const seen: { target: string; conn: number }[] = [];
const connIds = new WeakMap<Socket, number>();
let conns = 0;

/** The replica's script: a forged answer for /evil/<name>, else 200 `real:<target>`. */
export function forgedOrReal(socket: Socket, _nth: number, head: string): void {
  const target = head.split(' ')[1] ?? '';
  if (!connIds.has(socket)) connIds.set(socket, ++conns);
  seen.push({ target, conn: connIds.get(socket)! });
  const name = /\/evil\/([\w-]+)/.exec(target)?.[1];
  if (name !== undefined && FORGED[name] !== undefined) return void socket.write(FORGED[name]);
  const body = `real:${target}`;
  socket.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
}

export interface Parsed {
  status: number;
  headers: [string, string][];
  body: string;
}

/** The responses in `text`, framed as a client would (Content-Length, else chunked); `rest` is what is left. */
export function parseResponses(text: string): { responses: Parsed[]; rest: string } {
  const responses: Parsed[] = [];
  let p = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', p);
    if (end === -1) break;
    const [line, ...lines] = text.slice(p, end).split('\r\n');
    const headers = lines.map((l): [string, string] => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]);
    const get = (n: string): string | undefined => headers.find(([k]) => k === n)?.[1];
    let q = end + 4;
    let body = '';
    if (get('content-length') !== undefined) {
      const n = Number(get('content-length'));
      if (text.length < q + n) break;
      body = text.slice(q, q + n);
      q += n;
    } else if (get('transfer-encoding') === 'chunked') {
      let complete = false;
      for (;;) {
        const eol = text.indexOf('\r\n', q);
        if (eol === -1) break;
        const n = parseInt(text.slice(q, eol), 16);
        if (text.length < eol + 2 + n + 2) break;
        body += text.slice(eol + 2, eol + 2 + n);
        q = eol + 2 + n + 2;
        if (n === 0) {
          complete = true;
          break;
        }
      }
      if (!complete) break;
    }
    responses.push({ status: Number(line!.split(' ')[1]), headers, body });
    p = q;
  }
  return { responses, rest: text.slice(p) };
}

/** Send `requests` in one write on one connection, read until it closes. */
export function pipelined(port: number, requests: string[]): Promise<string> {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    let text = '';
    s.on('data', (c: Buffer) => (text += c.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => resolve(text));
    s.write(requests.join(''));
  });
}

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
  'the raw fast path': (target: string, last = false) => `GET /proxy/services/p/r${target} HTTP/1.1\r\nHost: h\r\n${last ? 'Connection: close\r\n' : ''}\r\n`,
  "Node's handover path": (target: string, last = false) => `GET /proxy/services/p/r${target} HTTP/1.0\r\nHost: h\r\n${last ? '' : 'Connection: keep-alive\r\n'}\r\n`,
};

describe.each(Object.entries(PATHS))('a forged replica answer on %s', (_path, request) => {
  it.each(['te-cl', 'te-cl-long', 'two-cl', 'longer-than-declared'])('%s → 502; the pipelined requests after it get their own answers', async (name) => {
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
  });

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
