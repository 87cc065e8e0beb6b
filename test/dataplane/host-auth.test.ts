// What the data plane does in a site's place for a host our default server relays by Host: the
// token check of an `auth: true` service (the connection held while the control server answers,
// later requests and a body kept in order), a model's preflight and CORS, and none of its own
// answers counted as a replica hit. Real HTTP replicas on 127.0.0.1, raw bytes on the shared
// socket; the control server's word is a function the test answers when it likes.

import { createServer, type Server } from 'node:http';
import { connect } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Balancer, Replicas, SERVICE_HEADER } from '../../src/dataplane/index.js';
import type { HostDecision } from '../../src/dataplane/host-auth.js';
import { tcpUpstream } from '../helpers/replicas.js';
import { tmpDir } from '../helpers/tmp.js';

/** What reached the replica: method, url, body and raw headers. */
const seen: { method: string; url: string; body: string; rawHeaders: string[] }[] = [];
/** Checks asked and not yet answered: the test decides. */
const pending: { project: string; authorization: string | undefined; answer: (d: HostDecision | Error) => void }[] = [];

let tmp: ReturnType<typeof tmpDir>;
let replica: Server;
let replicas: Replicas;
let balancer: Balancer;
let sock: string;

beforeAll(async () => {
  tmp = tmpDir('dp-host-auth-');
  replica = createServer((req, res) => {
    let body = '';
    req.setEncoding('latin1');
    req.on('data', (d: string) => (body += d));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', body, rawHeaders: req.rawHeaders });
      res.setHeader('Access-Control-Allow-Origin', 'https://replica.example');
      res.end(`seen ${req.url}`);
    });
  });
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  const port = (replica.address() as { port: number }).port;
  replicas = new Replicas();
  for (const s of ['main/guarded', 'main/chat', 'main/open']) replicas.set(s, 'r', tcpUpstream(port));
  replicas.setHostRoute('main/guarded', { host: 'guarded.test', cors: false, auth: true });
  replicas.setHostRoute('main/chat', { host: 'chat.test', cors: true, auth: true });
  replicas.setHostRoute('main/open', { host: 'open.test', cors: true, auth: false });
  balancer = new Balancer({
    socketDir: tmp.dir,
    replicas,
    shared: true,
    hostAuth: (project, authorization) =>
      new Promise((resolve, reject) =>
        pending.push({ project, authorization, answer: (d) => (d instanceof Error ? reject(d) : resolve(d)) }),
      ),
  });
  await balancer.listenAll(['main/guarded', 'main/chat', 'main/open']);
  sock = balancer.sharedSocketPath!;
});

beforeEach(() => {
  seen.length = 0;
  pending.length = 0;
});

afterAll(async () => {
  await balancer?.close();
  await replicas?.close();
  replica?.closeAllConnections();
  await new Promise((r) => replica?.close(r));
  tmp?.cleanup();
});

const byHost = (host: string, o: { method?: string; extra?: string; body?: string } = {}): string =>
  `${o.method ?? 'GET'} /x HTTP/1.1\r\nHost: ${host}\r\n${SERVICE_HEADER}: by-host\r\n${o.extra ?? ''}` +
  (o.body === undefined ? '\r\n' : `Content-Length: ${o.body.length}\r\n\r\n${o.body}`);

/** One connection: write, answer the checks as they come with `decide`, read `answers` responses. */
function session(
  parts: string[],
  answers: number,
  decide: (authorization: string | undefined) => HostDecision | Error,
): Promise<{ heads: string[]; bodies: string[]; closed: boolean }> {
  return new Promise((resolve, reject) => {
    const s = connect({ path: sock });
    let text = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`timed out; got ${text}`));
    }, 10_000);
    const poll = setInterval(() => {
      // Each check is answered only after the rest was written: what came after it waited.
      const p = pending.shift();
      if (p !== undefined) p.answer(decide(p.authorization));
    }, 20);
    const done = (closed: boolean): void => {
      clearTimeout(timer);
      clearInterval(poll);
      s.destroy();
      resolve({ ...split(text), closed });
    };
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      if (split(text).bodies.length >= answers) done(false);
    });
    s.on('error', () => undefined);
    s.once('close', () => done(true));
    for (const p of parts) s.write(p);
  });
}

/** Responses with Content-Length bodies (or none), as heads and bodies. */
function split(text: string): { heads: string[]; bodies: string[] } {
  const heads: string[] = [];
  const bodies: string[] = [];
  let at = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end === -1) break;
    const head = text.slice(at, end);
    const m = /content-length: (\d+)/i.exec(head);
    const len = m ? Number(m[1]) : 0;
    if (end + 4 + len > text.length) break;
    heads.push(head);
    bodies.push(text.slice(end + 4, end + 4 + len));
    at = end + 4 + len;
  }
  return { heads, bodies };
}

const MEMBER = (a: string | undefined): HostDecision => (a === undefined ? 'unauthenticated' : a === 'Bearer good' ? 'allow' : 'deny');

describe("the data plane in a by-host site's place", () => {
  it('relays an auth route only once its token passed, without the token, in order with what follows', async () => {
    const r = await session(
      [
        byHost('guarded.test', { extra: 'Authorization: Bearer good\r\n', method: 'POST', body: 'first' }),
        byHost('open.test'),
        byHost('guarded.test', { extra: 'Authorization: Bearer bad\r\n' }),
        byHost('guarded.test'),
      ],
      4,
      MEMBER,
    );
    expect(r.closed).toBe(false);
    expect(r.heads.map((h) => h.slice(0, h.indexOf('\r\n')))).toEqual([
      'HTTP/1.1 200 OK',
      'HTTP/1.1 200 OK',
      'HTTP/1.1 403 Forbidden',
      'HTTP/1.1 401 Unauthorized',
    ]);
    // The first waited for its check, its body with it; the public one behind it waited too.
    expect(seen.map((s) => `${s.method} ${s.body}`)).toEqual(['POST first', 'GET ']);
    const names = seen[0]!.rawHeaders.filter((_, i) => i % 2 === 0).map((h) => h.toLowerCase());
    expect(names).not.toContain('authorization');
    expect(names.filter((n) => n.startsWith('x-dstack'))).toEqual([]);
    // The refusals are the auth target's, and no hit.
    expect(JSON.parse(r.bodies[2]!)).toEqual({ detail: 'Unauthenticated or unauthorized to access project main' });
    expect(r.heads[3]).toContain('WWW-Authenticate: Bearer');
    expect(r.heads[3]).toContain('X-Dstack-Proxy-Hit: 0');
    expect(r.heads[0]).not.toContain('X-Dstack-Proxy-Hit');
  });

  it('answers 503 when nobody could say, and closes after a refused request with a body', async () => {
    const r = await session(
      [byHost('guarded.test', { extra: 'Authorization: Bearer x\r\n', body: 'unread' }), byHost('open.test')],
      1,
      () => new Error('control server down'),
    );
    expect(r.heads[0]).toMatch(/^HTTP\/1\.1 503 /);
    expect(r.heads[0]).toContain('Connection: close');
    expect(JSON.parse(r.bodies[0]!)).toEqual({ detail: 'The control server could not verify the token' });
    expect(seen).toEqual([]);
  });

  it('checks again when the route changed while the check ran', async () => {
    const r = await session([byHost('guarded.test', { extra: 'Authorization: Bearer good\r\n' })], 1, (a) => {
      // The host moved to another service meanwhile: the pass was for the old one.
      if (replicas.routeForHost('guarded.test')?.serviceKey === 'main/guarded') {
        replicas.setHostRoute('main/guarded', null);
        replicas.setHostRoute('main/chat', { host: 'guarded.test', cors: true, auth: true });
        return MEMBER(a);
      }
      return 'deny';
    });
    try {
      expect(r.heads[0]).toMatch(/^HTTP\/1\.1 403 /);
      expect(seen).toEqual([]);
    } finally {
      replicas.setHostRoute('main/chat', { host: 'chat.test', cors: true, auth: true });
      replicas.setHostRoute('main/guarded', { host: 'guarded.test', cors: false, auth: true });
    }
  });

  it("gives a model the site's CORS: preflights answered here, every answer with ours in place of the replica's", async () => {
    const r = await session(
      [
        byHost('chat.test', { method: 'OPTIONS' }),
        byHost('chat.test'),
        byHost('chat.test', { extra: 'Authorization: Bearer good\r\n' }),
        byHost('open.test'),
      ],
      4,
      MEMBER,
    );
    expect(r.heads.map((h) => h.slice(0, h.indexOf('\r\n')))).toEqual([
      'HTTP/1.1 204 No Content',
      'HTTP/1.1 401 Unauthorized',
      'HTTP/1.1 200 OK',
      'HTTP/1.1 200 OK',
    ]);
    for (const h of r.heads) {
      expect(h.match(/access-control-allow-origin: [^\r]*/gi)).toEqual(['Access-Control-Allow-Origin: *']);
      expect(h).toContain('Access-Control-Allow-Methods: GET, POST, PUT, PATCH, DELETE, OPTIONS');
    }
    expect(r.heads[0]).toContain('X-Dstack-Proxy-Hit: 0');
    expect(seen.map((s) => s.method)).toEqual(['GET', 'GET']); // no preflight reached the replica
  });

  it("answers a site's token check (its auth_request) with the control server's word, on a kept-alive connection", async () => {
    const check = (token?: string): string =>
      `GET /_dstack_auth HTTP/1.1\r\nHost: any.test\r\n${SERVICE_HEADER}: auth-check:main\r\n${token ? `Authorization: Bearer ${token}\r\n` : ''}\r\n`;
    const r = await session([check('good'), check(), check('bad'), check('good')], 4, (a) => (a === 'Bearer good' ? 'allow' : MEMBER(a)));
    expect(r.closed).toBe(false);
    expect(r.heads.map((h) => h.slice(0, h.indexOf('\r\n')))).toEqual([
      'HTTP/1.1 200 OK',
      'HTTP/1.1 401 Unauthorized',
      'HTTP/1.1 403 Forbidden',
      'HTTP/1.1 200 OK',
    ]);
    expect(r.heads[1]).toContain('WWW-Authenticate: Bearer');
    expect(seen).toEqual([]); // no replica asked
    // Nobody could say: 503, which auth_request turns into a 500, never a pass.
    const down = await session([check('good')], 1, () => new Error('down'));
    expect(down.heads[0]).toMatch(/^HTTP\/1\.1 503 /);
    // A project name that could not be one is refused as a bad request.
    const bad = await session([check('good').replace('auth-check:main', 'auth-check:../x')], 1, MEMBER);
    expect(bad.heads[0]).toMatch(/^HTTP\/1\.1 400 /);
  });
});
