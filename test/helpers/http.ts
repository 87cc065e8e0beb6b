// Minimal HTTP(S) client and echo backend for tests that talk to the real Nginx.

import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http';
import { request as httpsRequest } from 'node:https';

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

export interface RequestOptions {
  port: number;
  /** Host header (and TLS server name). */
  host: string;
  path?: string;
  method?: string;
  headers?: Record<string, string>;
  /** Source address, e.g. 127.0.0.2 to look like a remote client to Nginx. */
  localAddress?: string;
  /** PEM CA for HTTPS; without it the request is plain HTTP. */
  ca?: string;
}

export function request(o: RequestOptions): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const common = {
      host: '127.0.0.1',
      port: o.port,
      path: o.path ?? '/',
      method: o.method ?? 'GET',
      headers: { host: o.host, ...o.headers },
      localAddress: o.localAddress,
      agent: false as const,
    };
    const req = o.ca ? httpsRequest({ ...common, servername: o.host, ca: o.ca }) : httpRequest(common);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** A backend that answers every request with JSON {name, method, url, headers}. */
export async function startEcho(name: string, listen: { port: number } | { path: string }): Promise<Server> {
  const srv = createServer((req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ name, method: req.method, url: req.url, headers: req.headers }));
  });
  srv.on('upgrade', (req, socket) => {
    socket.end(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${req.headers.upgrade ?? ''}\r\nConnection: Upgrade\r\nX-Echo: ${name}\r\n\r\n`,
    );
  });
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    if ('path' in listen) srv.listen(listen.path, resolve);
    else srv.listen(listen.port, '127.0.0.1', resolve);
  });
  return srv;
}

export function close(srv: Server): Promise<void> {
  srv.closeAllConnections();
  return new Promise((resolve) => srv.close(() => resolve()));
}
