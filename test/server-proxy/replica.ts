// A real HTTP replica for the server-proxy tests, httpbin-like:
//   /echo…            JSON {method, url, headers, bodyBytes, sha256}
//   /status/<code>    that status, empty body
//   /cookies/set?k=v  302 + Set-Cookie k=v        /cookies → {cookies} from the Cookie header
//   /response-headers?Name=value…  those headers set on the response
//   /hang             never answers                /reset → socket destroyed
//   /sse              "data: 1", then "data: 2" only after release() is called
//   /ws (Upgrade)     WebSocket echo of short text frames
//   OPTIONS *         200, Allow: HEAD, GET, OPTIONS
//   /sink             counts the body bytes and answers {bytes}

import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

export interface TestReplica {
  server: Server;
  port: number;
  /** Lets /sse send its second chunk. */
  release(): void;
  /** Requests seen, by path. */
  seen: string[];
  close(): Promise<void>;
}

export async function startReplica(port = 0): Promise<TestReplica> {
  const gates: (() => void)[] = [];
  let released = 0;
  const seen: string[] = [];
  const hanging = new Set<ServerResponse>();
  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://replica');
    seen.push(req.url ?? '');
    const json = (status: number, body: unknown, headers: Record<string, string> = {}): void => {
      const text = JSON.stringify(body);
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
      res.end(req.method === 'HEAD' ? undefined : text);
    };
    if (req.method === 'OPTIONS') {
      res.writeHead(200, { allow: 'HEAD, GET, OPTIONS', 'content-length': 0 });
      res.end();
      return;
    }
    const p = url.pathname;
    if (p.startsWith('/status/')) {
      res.writeHead(Number(p.slice(8)), { 'content-length': 0 });
      res.end();
      return;
    }
    if (p === '/cookies/set') {
      res.writeHead(302, { location: '/cookies', 'set-cookie': [...url.searchParams].map(([k, v]) => `${k}=${v}; Path=/`) });
      res.end();
      return;
    }
    if (p === '/cookies') {
      const cookies = Object.fromEntries(
        (req.headers.cookie ?? '')
          .split(';')
          .map((c) => c.trim())
          .filter(Boolean)
          .map((c) => c.split('=') as [string, string]),
      );
      json(200, { cookies });
      return;
    }
    if (p === '/response-headers') {
      json(200, {}, Object.fromEntries(url.searchParams));
      return;
    }
    if (p === '/hang') {
      hanging.add(res);
      return;
    }
    if (p === '/reset') {
      req.socket.destroy();
      return;
    }
    if (p === '/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write('data: 1\n\n');
      const send2 = (): void => {
        res.write('data: 2\n\n');
        res.end();
      };
      if (released > 0) {
        released--;
        send2();
      } else gates.push(send2);
      return;
    }
    const hash = createHash('sha256');
    let bytes = 0;
    req.on('data', (c: Buffer) => {
      bytes += c.length;
      if (p !== '/sink') hash.update(c);
    });
    req.on('end', () => {
      if (p === '/sink') return json(200, { bytes });
      json(200, {
        method: req.method,
        url: req.url,
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        bodyBytes: bytes,
        sha256: hash.digest('hex'),
      });
    });
  };
  const server = createServer({ keepAliveTimeout: 5_000 }, handle);
  const upgraded = new Set<Duplex>();
  server.on('upgrade', (req: IncomingMessage, socket: Duplex) => {
    seen.push(req.url ?? '');
    upgraded.add(socket);
    socket.once('close', () => upgraded.delete(socket));
    socket.once('end', () => socket.end());
    const key = req.headers['sec-websocket-key'];
    if (typeof key !== 'string') return void socket.destroy();
    const accept = createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nX-Seen-Path: ${req.url}\r\n\r\n`,
    );
    let buf = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      // Short masked frames only (payload < 126): FIN+opcode, MASK+len, 4-byte mask, payload.
      while (buf.length >= 6) {
        const opcode = buf[0]! & 0x0f;
        const len = buf[1]! & 0x7f;
        if (buf.length < 6 + len) break;
        const mask = buf.subarray(2, 6);
        const payload = Buffer.from(buf.subarray(6, 6 + len).map((b, i) => b ^ mask[i % 4]!));
        buf = buf.subarray(6 + len);
        if (opcode === 0x8) {
          socket.end(Buffer.from([0x88, 0]));
          return;
        }
        socket.write(Buffer.concat([Buffer.from([0x80 | opcode, payload.length]), payload]));
      }
    });
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    server,
    port: (server.address() as { port: number }).port,
    seen,
    release() {
      const g = gates.shift();
      if (g) g();
      else released++;
    },
    async close() {
      for (const r of hanging) r.destroy();
      for (const s of upgraded) s.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
