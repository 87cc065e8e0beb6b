// Sockets as dstack's server leaves them in the gateway's server-connections directory: live
// ones (a small fastify app per socket playing one server process) and stale ones (a socket
// file nobody listens on any more).

import { createServer } from 'node:net';
import { renameSync } from 'node:fs';
import Fastify from 'fastify';

export interface LiveSocket {
  path: string;
  /** `project token` of each question. */
  calls: string[];
  close(): Promise<void>;
}

/**
 * `POST /api/projects/:project/get`: 200 when the token starts with `member-` (any project),
 * 403 otherwise; a token `hang` is never answered.
 */
export async function liveSocket(path: string): Promise<LiveSocket> {
  const calls: string[] = [];
  const app = Fastify({ forceCloseConnections: true });
  app.post<{ Params: { project: string } }>('/api/projects/:project/get', async (req, reply) => {
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
    calls.push(`${req.params.project} ${token}`);
    if (token === 'hang') return new Promise(() => undefined);
    if (token.startsWith('member-')) return { project_name: req.params.project };
    return reply.code(403).send({ detail: [{ msg: 'Access denied' }] });
  });
  await app.listen({ path });
  return { path, calls, close: () => app.close() };
}

/** A socket file whose listener is gone (a server process that died): connects are refused. */
export async function deadSocket(path: string): Promise<void> {
  const srv = createServer();
  const tmp = `${path}.listening`;
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(tmp, resolve);
  });
  // Closing a listener removes its file; moved away first, the file stays behind as sshd leaves it.
  renameSync(tmp, path);
  await new Promise<void>((resolve) => srv.close(() => resolve()));
}

/** A listener that accepts and closes at once: a forward whose far end is gone. */
export async function closingSocket(path: string): Promise<{ accepted: () => number; close: () => Promise<void> }> {
  let accepted = 0;
  const srv = createServer((c) => {
    accepted++;
    c.destroy();
  });
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(path, resolve);
  });
  return { accepted: () => accepted, close: () => new Promise<void>((resolve) => srv.close(() => resolve())) };
}
