// The router allowlist and the per-service read timeout in the rendered site: the allowed
// locations (exact and prefix), limits folded onto them by the longest prefix, the 403 catch-all
// on both servers, proxy_read_timeout per service; services without the fields render as before.
// Then the config on a real Nginx: `nginx -t` passes, allowed paths reach the replica, others get 403.

import { request as httpRequest } from 'node:http';
import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyFiles, diffFiles, readOwned } from '../../../src/reconcilers/nginx/apply.js';
import { renderAll, renderSite } from '../../../src/reconcilers/nginx/render.js';
import { buildViews, type ServiceSiteView, type ViewOptions } from '../../../src/reconcilers/nginx/view.js';
import type { RateLimit, Service } from '../../../src/spec/types.js';
import { close, request, startEcho } from '../../helpers/http.js';
import { startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { freePorts } from '../../helpers/ports.js';
import { sampleState, service } from './fixtures.js';

const opts: ViewOptions = {
  httpPort: 80,
  httpsPort: 443,
  acmeWebroot: '/var/lib/dstack-proxy/acme',
  accessLogPath: '/var/log/dstack-proxy/access.log',
  internalSocket: '/var/lib/dstack-proxy/nginx-internal/nginx.sock',
};

const limit = (prefix: string, rps = 1, burst = 0): RateLimit => ({ prefix, key: { type: 'ipAddress' }, rps, burst });

function siteOf(s: Service, o: ViewOptions = opts): { view: ServiceSiteView; text: string } {
  const state = sampleState(8001);
  state.spec.services = [s];
  state.spec.entrypoints = [];
  const view = buildViews(state, o).sites[0] as ServiceSiteView;
  return { view, text: renderSite(view) };
}

/** The `location <name> { … }` blocks of a text, in order, by name (both servers: first wins). */
function locations(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const re = /^ {4}location (.+) \{\n((?: {8}.*\n|\n)*?) {4}\}$/gm;
  for (const m of text.matchAll(re)) {
    if (!out.has(m[1]!))
      out.set(
        m[1]!,
        m[2]!
          .split('\n')
          .map((l) => l.trim())
          .filter((l) => l !== ''),
      );
  }
  return out;
}

const router = (over: Partial<Service> = {}): Service =>
  service({
    run: 'router',
    domain: 'router.gw.test',
    routerAllowlist: true,
    replicas: [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: 8001 } }],
    ...over,
  });

describe('router allowlist in the service site', () => {
  it('serves exactly /generate, /v1/ and /chat/completions and refuses the rest with a JSON 403', () => {
    const { text } = siteOf(router());
    const locs = locations(text);
    expect([...locs.keys()].filter((k) => !k.startsWith('@') && !k.startsWith('^~') && !k.startsWith('= /_'))).toEqual([
      '= /chat/completions',
      '= /generate',
      '/v1/',
      '/',
    ]);
    for (const name of ['= /chat/completions', '= /generate', '/v1/']) {
      expect(locs.get(name)).toEqual(['try_files /nonexistent @dstack_replica;']);
    }
    expect(locs.get('/')).toEqual(['default_type application/json;', `return 403 '{"detail":"Path is not allowed for this service"}';`]);
    // The internal server (the model API) has the same rule: one catch-all per server.
    expect(text.match(/^ {4}location \/ \{$/gm)).toHaveLength(2);
    expect(text.match(/^ {4}location = \/generate \{$/gm)).toHaveLength(2);
  });

  it('keeps auth_request on the allowed locations and none on the refusing one', () => {
    const { text } = siteOf(router({ auth: true }));
    const locs = locations(text);
    for (const name of ['= /chat/completions', '= /generate', '/v1/']) expect(locs.get(name)).toContain('auth_request /_dstack_auth;');
    expect(locs.get('/')).not.toContain('auth_request /_dstack_auth;');
  });

  it('folds limits onto the allowed locations by the longest matching prefix', () => {
    const { view, text } = siteOf(
      router({
        rateLimits: [
          limit('/', 10, 20), // zone 0: every allowed path unless a longer prefix matches
          limit('/v1', 5), // zone 1: /v1/ ("/v1/" starts with "/v1")
          limit('/gen', 2, 3), // zone 2: /generate
          limit('/v1/chat/', 1), // zone 3: inside /v1/, a location of its own
          limit('/admin', 1), // zone 4: a refused path, nothing to limit
          limit('/v1', 7), // zone 5: same prefix as zone 1, both apply
        ],
      }),
    );
    const byPrefix = new Map(view.locations.map((l) => [`${l.exact ? '= ' : ''}${l.prefix}`, l.limits.map((x) => x.zone)]));
    const zone = (i: number) => view.zones[i]!.name;
    expect(byPrefix).toEqual(
      new Map([
        ['= /chat/completions', [zone(0)]],
        ['= /generate', [zone(2)]],
        ['/v1/', [zone(1), zone(5)]],
        ['/v1/chat/', [zone(3)]],
      ]),
    );
    const locs = locations(text);
    expect(locs.get('= /generate')).toContain(`limit_req zone=${zone(2)} burst=3 nodelay;`);
    expect(locs.get('/v1/chat/')).toEqual([`limit_req zone=${zone(3)};`, 'try_files /nonexistent @dstack_replica;']);
    expect(locs.has('/admin')).toBe(false);
  });

  it('keeps CORS for an OpenAI model at server level, so refused paths carry it too', () => {
    const { text } = siteOf(router({ model: { name: 'm', format: 'openai', prefix: '/v1' } }));
    expect(text).toContain('add_header Access-Control-Allow-Origin * always;');
    expect(text).toContain('proxy_hide_header Access-Control-Allow-Origin;');
  });
});

describe('per-service read timeout', () => {
  it("uses the service's readTimeout for proxy_read_timeout, on both servers", () => {
    const { text } = siteOf(router({ routerAllowlist: undefined, readTimeout: 1800 }), { ...opts, proxyReadTimeoutSec: 300 });
    expect(text.match(/proxy_read_timeout 1800s;/g)).toHaveLength(2);
    expect(text).not.toContain('proxy_read_timeout 300s;');
  });

  it("uses the daemon's default without it", () => {
    const { text } = siteOf(router({ routerAllowlist: undefined }), { ...opts, proxyReadTimeoutSec: 42 });
    expect(text.match(/proxy_read_timeout 42s;/g)).toHaveLength(2);
  });
});

describe('services without the fields', () => {
  it('render byte for byte as the sample snapshots', async () => {
    // The snapshots of render.test.ts were written before the fields existed.
    const full: ViewOptions = {
      ...opts,
      certFor: (d) =>
        d === 'llama-8b.gw.test' || d === 'gateway.gw.test'
          ? { certPath: `/certs/${d}/fullchain.pem`, keyPath: `/certs/${d}/privkey.pem` }
          : null,
      upstreamFor: (s) =>
        s.run === 'plain'
          ? { kind: 'socket', path: '/run/dstack-proxy/main.plain.sock' }
          : { kind: 'direct', servers: s.replicas.flatMap((r) => (r.direct ? [`${r.direct.host}:${r.direct.port}`] : [])) },
      entrypointKeyInclude: '/var/lib/dstack-proxy/nginx-internal/entrypoint-key.conf',
    };
    for (const [name, text] of renderAll(buildViews(sampleState(8001), full))) {
      await expect(text).toMatchFileSnapshot(`./__snapshots__/${name.replace('/', '__')}`);
    }
  });

  it('renders 10,000 services with and without the allowlist', () => {
    const state = sampleState(8001);
    state.spec.entrypoints = [];
    state.spec.services = Array.from({ length: 10_000 }, (_, i) =>
      service({
        run: `s${i}`,
        domain: `s${i}.gw.test`,
        ...(i % 2 === 0 ? { routerAllowlist: true as const, readTimeout: 600 } : {}),
        rateLimits: [limit('/v1/', 1)],
        replicas: [{ id: `r${i}`, appPort: 8000, direct: { host: '127.0.0.1', port: 8001 } }],
      }),
    );
    const files = renderAll(buildViews(state, opts));
    expect(files.size).toBe(10_001);
    expect(files.get('sites/s0.gw.test.conf')).toContain('location = /generate {');
    expect(files.get('sites/s0.gw.test.conf')).toContain('proxy_read_timeout 600s;');
    expect(files.get('sites/s1.gw.test.conf')).not.toContain('return 403');
    expect(files.get('sites/s1.gw.test.conf')).toContain('proxy_read_timeout 300s;');
  });
});

describe('on a real Nginx', () => {
  let ng: TestNginx;
  let backend: Server;

  beforeAll(async () => {
    ng = await startTestNginx();
    const [port] = (await freePorts(1)) as [number];
    backend = await startEcho('replica', { port });
    const state = sampleState(port);
    state.spec.entrypoints = [];
    state.spec.services = [
      router({
        auth: false,
        readTimeout: 5,
        rateLimits: [limit('/', 100, 100), limit('/v1/chat/', 100, 100), limit('/generate', 100, 100)],
        model: { name: 'm', format: 'openai', prefix: '/v1' },
        replicas: [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port } }],
      }),
    ];
    const views = buildViews(state, {
      httpPort: ng.httpPort,
      httpsPort: ng.httpsPort,
      acmeWebroot: ng.acmeWebroot,
      accessLogPath: ng.accessLogPath,
    });
    const changes = diffFiles(renderAll(views), await readOwned(ng.paths.confDir));
    const r = await applyFiles({ changes, sitesDir: ng.paths.confDir, mainConfPath: ng.paths.confPath, test: ng.test, reload: ng.reload });
    expect(r.heldBack).toEqual([]);
    expect(r.reloaded).toBe(true);
  });

  afterAll(async () => {
    await ng?.stop();
    if (backend) await close(backend);
  });

  it('passes nginx -t', async () => {
    expect(await ng.test(ng.paths.confPath)).toEqual({ ok: true });
  });

  it.each(['/generate', '/generate?stream=1', '/v1/', '/v1/models', '/v1/chat/completions', '/chat/completions'])(
    'lets %s through',
    async (path) => {
      const r = await request({ port: ng.httpPort, host: 'router.gw.test', path });
      expect(r.status).toBe(200);
      expect(JSON.parse(r.body)).toMatchObject({ name: 'replica', url: path });
    },
  );

  it.each([
    '/',
    '/health',
    '/v1',
    '/generate/x',
    '/generatex',
    '/chat/completions/',
    '/v2/models',
    '/v1/../admin',
    '/v1/%2e%2e/admin',
    '//admin',
  ])('refuses %s with 403 and a JSON detail', async (path) => {
    const r = await request({ port: ng.httpPort, host: 'router.gw.test', path });
    expect(r.status).toBe(403);
    expect(r.headers['content-type']).toBe('application/json');
    expect(JSON.parse(r.body)).toEqual({ detail: 'Path is not allowed for this service' });
    expect(r.headers['access-control-allow-origin']).toBe('*');
  });

  it('passes WebSocket upgrades on an allowed path', async () => {
    const upgraded = await new Promise<string | undefined>((resolve, reject) => {
      const req = httpRequest({
        host: '127.0.0.1',
        port: ng.httpPort,
        path: '/v1/realtime',
        headers: { host: 'router.gw.test', connection: 'Upgrade', upgrade: 'websocket' },
      });
      req.on('upgrade', (res, socket) => {
        socket.destroy();
        resolve(res.headers['x-echo'] as string | undefined);
      });
      req.on('response', (res) => reject(new Error(`no upgrade: ${res.statusCode}`)));
      req.on('error', reject);
      req.end();
    });
    expect(upgraded).toBe('replica');
  });
});
