// A replica that answers its name (x-replica too) and holds `/hold…` requests until release(),
// and a request on its own connection: for tests of what a removed replica still gets.

import { createServer, request as httpRequest, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { KeptReply } from './balancing.js';

/** A replica answering its name (x-replica too); `/hold…` waits for release() when it holds. */
export interface HoldingReplica {
  name: string;
  port: number;
  /** Paths it got, in order. */
  got: string[];
  held: ServerResponse[];
  release(): void;
  close(): Promise<void>;
}

export async function holdingReplica(name: string, holds: boolean): Promise<HoldingReplica> {
  const sockets = new Set<Socket>();
  const r: HoldingReplica = {
    name,
    port: 0,
    got: [],
    held: [],
    release: () => {
      for (const res of r.held.splice(0)) res.end(`${name}:held`);
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server: Server = createServer((req, res) => {
    r.got.push(req.url ?? '');
    req.resume();
    res.setHeader('x-replica', name);
    res.setHeader('content-type', 'text/plain');
    if (holds && req.url?.startsWith('/hold')) r.held.push(res);
    else res.end(name);
  });
  server.keepAliveTimeout = 60_000;
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  r.port = (server.address() as { port: number }).port;
  return r;
}

/** One request on its own connection to 127.0.0.1:port (so that it never waits behind another). */
export function sendAlone(port: number, host: string, path: string): Promise<KeptReply> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path, agent: false, headers: { host } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, replica: String(res.headers['x-replica'] ?? ''), body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}
