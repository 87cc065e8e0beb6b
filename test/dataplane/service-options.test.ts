// A service's own read timeout in the data plane (Replicas.setServiceOptions), against real HTTP
// replicas on 127.0.0.1: a replica silent past its service's timeout gets the catalog's 504
// before the head and a cut answer after it, while another service keeps the default; a
// changed timeout applies to the next request; back to the default when unset.

import { createServer, type Server, type ServerResponse } from 'node:http';
import { connect as netConnect } from 'node:net';
import type { Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { statusFor } from '../../src/dataplane/errors.js';
import { Replicas } from '../../src/dataplane/replicas.js';
import type { Http1Request } from '../../src/http1/index.js';

interface Answer {
  status?: number;
  body: string;
  error?: Error;
}

function send(rs: Replicas, key: string, path = '/'): Promise<Answer> {
  const out: Answer = { body: '' };
  return new Promise((resolve) => {
    const req: Http1Request = { method: 'GET', path, headers: ['host', 'svc'] };
    rs.dispatch(key, req, {
      onResponseStart(status) {
        out.status = status;
      },
      onResponseData(chunk) {
        out.body += chunk.toString();
        return true;
      },
      onResponseEnd: () => resolve(out),
      onResponseError(err) {
        out.error = err;
        resolve(out);
      },
    });
  });
}

const servers: Server[] = [];
const books: Replicas[] = [];
const pending = new Set<NodeJS.Timeout>();

afterEach(async () => {
  for (const t of pending) clearTimeout(t);
  pending.clear();
  for (const rs of books.splice(0)) await rs.close();
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
});

/**
 * `/pause-head?ms=N` answers after N ms; `/pause-body?ms=N` sends its head and a first chunk at
 * once and the rest after N ms; anything else answers at once.
 */
async function replica(): Promise<{ port: number }> {
  const later = (ms: number, f: () => void): void => {
    const t = setTimeout(() => {
      pending.delete(t);
      f();
    }, ms);
    pending.add(t);
  };
  const server = createServer((req, res: ServerResponse) => {
    const u = new URL(req.url ?? '/', 'http://r');
    const ms = Number(u.searchParams.get('ms') ?? 0);
    if (u.pathname === '/pause-head') later(ms, () => res.end('late'));
    else if (u.pathname === '/pause-body') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('first;');
      later(ms, () => res.end('rest'));
    } else res.end('now');
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as { port: number }).port };
}

function upstream(port: number) {
  return {
    isReady: () => true,
    open: () =>
      new Promise<Duplex>((resolve, reject) => {
        const s = netConnect({ host: '127.0.0.1', port });
        s.once('connect', () => resolve(s));
        s.once('error', reject);
      }),
  };
}

function books_(): Replicas {
  // The default is long: only a service's own timeout can fire within these tests.
  const rs = new Replicas({ readTimeoutMs: 60_000, keepAliveTimeoutMs: 2_000 });
  books.push(rs);
  return rs;
}

describe('a per-service read timeout', () => {
  it("a replica silent past its service's timeout before the head: the catalog's 504; another service keeps the default", async () => {
    const r = await replica();
    const rs = books_();
    rs.set('p/short', 'a', upstream(r.port));
    rs.set('p/long', 'b', upstream(r.port));
    rs.setServiceOptions('p/short', { readTimeoutMs: 300 });
    expect(rs.serviceOptions()).toEqual(new Map([['p/short', { readTimeoutMs: 300 }]]));

    const cut = await send(rs, 'p/short', '/pause-head?ms=1500');
    expect(cut.status).toBeUndefined();
    expect(statusFor(cut.error, 'p/short')).toMatchObject({ status: 504, code: 'DP_ERR_UPSTREAM_TIMEOUT' });

    const full = await send(rs, 'p/long', '/pause-head?ms=1500');
    expect(full).toMatchObject({ status: 200, body: 'late' });
    expect(full.error).toBeUndefined();
  });

  it('a pause inside the body longer than the timeout cuts the answer after its head', async () => {
    const r = await replica();
    const rs = books_();
    rs.set('p/s', 'a', upstream(r.port));
    rs.setServiceOptions('p/s', { readTimeoutMs: 300 });
    const a = await send(rs, 'p/s', '/pause-body?ms=1500');
    expect(a.status).toBe(200);
    expect(a.body).toBe('first;');
    expect(a.error).toBeDefined();
    expect((a.error as { code?: string }).code).toBe('DP_HTTP1_BODY_TIMEOUT');
  });

  it('applies a change to the next request (a pool made before it too), and unset goes back to the default', async () => {
    const r = await replica();
    const rs = books_();
    rs.set('p/s', 'a', upstream(r.port));
    // A pool and a kept-alive connection exist before the option is set.
    expect(await send(rs, 'p/s')).toMatchObject({ status: 200, body: 'now' });
    rs.setServiceOptions('p/s', { readTimeoutMs: 300 });
    expect(statusFor((await send(rs, 'p/s', '/pause-head?ms=1500')).error, 'p/s').status).toBe(504);
    rs.setServiceOptions('p/s', {});
    expect(rs.serviceOptions().size).toBe(0);
    expect(await send(rs, 'p/s', '/pause-head?ms=1000')).toMatchObject({ status: 200, body: 'late' });
    // Set again to the same value: nothing changes, the replica keeps serving.
    rs.setServiceOptions('p/s', {});
    expect(await send(rs, 'p/s')).toMatchObject({ status: 200, body: 'now' });
  });

  it('refuses a timeout that is not a positive number', () => {
    const rs = books_();
    expect(() => rs.setServiceOptions('p/s', { readTimeoutMs: 0 })).toThrow(RangeError);
    expect(() => rs.setServiceOptions('p/s', { readTimeoutMs: Number.NaN })).toThrow(RangeError);
  });
});
