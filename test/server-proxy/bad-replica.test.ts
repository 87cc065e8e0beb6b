// A replica that misbehaves at the HTTP level (scripted on raw TCP): the proxy answers 502 and
// carries on, never crashes, never reuses a connection that is out of step; a keep-alive
// connection the replica closed as a request arrived is retried once for idempotent requests.

import type { Server, Socket } from 'node:net';
import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startScriptedReplica } from '../helpers/scripted-replica.js';
import { startPluginApp, type PluginApp } from './harness.js';

/** What the replica does with the n-th request on a connection (0-based). */
let script: (socket: Socket, nth: number, head: string) => void;
let replica: Server;
let proxy: PluginApp;
let port: number;

interface Answer {
  status: number;
  body: string;
  error?: string;
}

function get(path: string, method = 'GET', body?: string): Promise<Answer> {
  return new Promise((resolve) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        path: `/proxy/services/p/r${path}`,
        method,
        agent: false,
        headers: body ? { 'content-length': String(body.length) } : {},
      },
      (res) => {
        let text = '';
        res.setEncoding('latin1');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
        res.on('error', (err) => resolve({ status: res.statusCode ?? 0, body: text, error: err.message }));
      },
    );
    req.on('error', (err) => resolve({ status: 0, body: '', error: err.message }));
    req.end(body);
  });
}

beforeAll(async () => {
  const scripted = await startScriptedReplica((socket, nth, head) => script(socket, nth, head));
  replica = scripted.server;
  proxy = await startPluginApp(scripted.port, { clientMaxBodySize: 0 });
  port = proxy.port;
});

afterAll(async () => {
  await proxy?.app.close();
  await new Promise((r) => replica?.close(r));
});

const OK = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok';

describe('a misbehaving replica', () => {
  it.each([
    ['headers over 64 KiB', `HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(70_000)}\r\nContent-Length: 0\r\n\r\n`],
    ['not HTTP', 'SSH-2.0-OpenSSH_9.6\r\n\r\n'],
    ['a header injected with a bare LF', 'HTTP/1.1 200 OK\r\nX-A: 1\nSet-Cookie: evil=1\r\nContent-Length: 0\r\n\r\n'],
    ['an unasked 101', 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n'],
  ])('%s → 502, and the next request works on a new connection', async (_name, answer) => {
    let bad = true;
    script = (socket) => socket.write(bad ? answer : OK);
    const r = await get('/x');
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Error requesting upstream' });
    bad = false;
    const before = proxy.connects();
    expect((await get('/y')).body).toBe('ok');
    expect(proxy.connects() - before).toBe(1); // the connection that answered badly was closed
  });

  it.each([
    ['cut short', 'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this', true],
    ['with a bad chunk size', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nsome\r\nzz\r\n', false],
  ])('a body %s after the headers: the client connection is cut, never a complete-looking answer', async (_name, answer, end) => {
    script = (socket) => (end ? socket.end(answer) : socket.write(answer));
    const r = await get('/x');
    expect(r.error).toBeDefined();
    script = (socket) => socket.write(OK);
    expect((await get('/y')).body).toBe('ok');
  });

  it('stale keep-alive connection: GET is retried once on a new connection; POST with a body is not (502)', async () => {
    script = (socket) => socket.write(OK);
    await get('/warm'); // leaves an idle keep-alive connection
    script = (socket, nth) => {
      if (nth === 0) socket.write(OK);
      else socket.destroy(); // closed by the replica as the request arrived
    };
    const before = proxy.connects();
    expect((await get('/again')).body).toBe('ok');
    expect(proxy.connects() - before).toBe(1);
    const post = await get('/post', 'POST', 'payload');
    expect(post.status).toBe(502);
  });
});
