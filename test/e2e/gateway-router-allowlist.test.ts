// The router allowlist and the per-service read timeout on the gateway, with its real Nginx and
// data plane: allowed paths (`/generate`, `/v1/…`, `/chat/completions`) reach the replica with
// auth, CORS and stats as on any service; every other path (`/`, `/health`, `/v1`, `/generate/x`…)
// gets a JSON 403 and never reaches it; a replica pausing 3 s answers a JSON 504 on a service with
// `readTimeout: 1` and in full with the default; the site carries its own proxy_read_timeout.

import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { putState, siteFile, type TestGateway } from '../helpers/gateway.js';
import { close } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { call, requestsIn30s, startControlServer, startGatewayWith, type ControlServer } from './integration-harness.js';

const MEMBER = 'router-member-token-0815';
const REFUSED_BODY = { detail: 'Path is not allowed for this service' };

/** Every request it sees, by target; `/slow` answers after 3 s. */
async function startReplica(): Promise<{ server: Server; port: number; seen: string[] }> {
  const seen: string[] = [];
  const server = createServer((req, res) => {
    seen.push(req.url ?? '');
    const answer = (): void => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ url: req.url, authorization: req.headers.authorization ?? null }));
    };
    if (req.url === '/slow') setTimeout(answer, 3_000).unref();
    else answer();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as { port: number }).port, seen };
}

let control: ControlServer;
let replica: Awaited<ReturnType<typeof startReplica>>;
let t: TestGateway;

const svc = (run: string, extra: Record<string, unknown>) => ({
  project: 'main',
  run,
  domain: `${run}.gw.test`,
  https: false,
  auth: false,
  replicas: [{ id: `${run}-r0`, appPort: replica.port, direct: { host: '127.0.0.1', port: replica.port } }],
  ...extra,
});

const get = (host: string, path: string, headers: Record<string, string> = {}) => call({ port: t.httpPort, host, path, headers });

beforeAll(async () => {
  control = await startControlServer({ main: [MEMBER] });
  replica = await startReplica();
  t = await startGatewayWith({ serverUrl: control.url });
  const doc = {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      projects: [{ name: 'main' }],
      services: [
        svc('router', {
          routerAllowlist: true,
          auth: true,
          model: { name: 'acme/router', format: 'openai', prefix: '/v1' },
          rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 1000, burst: 1000 }],
        }),
        svc('short', { readTimeout: 1 }),
        svc('plain', {}),
      ],
      entrypoints: [],
    },
  };
  const r = await putState(t, doc);
  expect(r.status).toBe(200);
  // Bounded wait for the sites and the data plane to serve.
  for (const host of ['short.gw.test', 'plain.gw.test']) {
    await eventually(async () => ((await get(host, '/')).status === 200 ? true : undefined), 30_000);
  }
}, 90_000);

afterAll(async () => {
  await t?.cleanup();
  if (replica) await close(replica.server);
  await control?.close();
});

const auth = { authorization: `Bearer ${MEMBER}` };

describe('router allowlist on the gateway', () => {
  it.each(['/generate', '/v1/models', '/v1/chat/completions', '/chat/completions'])(
    'lets %s through to the replica, authenticated, without the token',
    async (path) => {
      const r = await eventually(async () => {
        const x = await get('router.gw.test', path, auth);
        return x.status === 200 ? x : undefined;
      }, 30_000);
      expect(JSON.parse(r.body)).toEqual({ url: path, authorization: null });
      expect(r.headers['access-control-allow-origin']).toBe('*');
    },
  );

  it('still asks for a token on an allowed path', async () => {
    const r = await get('router.gw.test', '/v1/models');
    expect([401, 403]).toContain(r.status);
  });

  it.each(['/', '/health', '/v1', '/generate/x', '/metrics', '/v1/../admin'])(
    'refuses %s with a JSON 403, with or without a token, and never asks the replica',
    async (path) => {
      const before = replica.seen.length;
      for (const headers of [{}, auth]) {
        const r = await get('router.gw.test', path, headers);
        expect(r.status).toBe(403);
        expect(r.headers['content-type']).toBe('application/json');
        expect(JSON.parse(r.body)).toEqual(REFUSED_BODY);
      }
      expect(replica.seen.length).toBe(before);
    },
  );

  it('counts the allowed requests in the stats, not the refused ones', async () => {
    const before = await requestsIn30s(t, 'main', 'router');
    for (let i = 0; i < 3; i++) expect((await get('router.gw.test', '/generate', auth)).status).toBe(200);
    for (let i = 0; i < 2; i++) expect((await get('router.gw.test', '/health', auth)).status).toBe(403);
    // A refused request is no replica hit: the count reaches before + 3 and stays there.
    await eventually(async () => ((await requestsIn30s(t, 'main', 'router')) >= before + 3 ? true : undefined), 30_000);
    expect(await requestsIn30s(t, 'main', 'router')).toBe(before + 3);
  });
});

describe('per-service read timeout on the gateway', () => {
  it("writes the service's own proxy_read_timeout, the default elsewhere", () => {
    expect(readFileSync(siteFile(t, 'short.gw.test'), 'utf8')).toContain('proxy_read_timeout 1s;');
    expect(readFileSync(siteFile(t, 'plain.gw.test'), 'utf8')).toContain('proxy_read_timeout 300s;');
  });

  it('a replica pausing 3 s on a service with readTimeout 1: 504 in JSON, not an HTML page', async () => {
    const r = await get('short.gw.test', '/slow');
    expect(r.status).toBe(504);
    expect(r.headers['content-type']).toMatch(/^application\/json/);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Timed out requesting upstream' });
  });

  it('the same pause with the default timeout: the full answer', async () => {
    const r = await get('plain.gw.test', '/slow');
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body)).toMatchObject({ url: '/slow' });
  });
});
