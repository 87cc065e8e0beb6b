// Snapshot plus must-contain: the snapshot catches any change, the line checks make
// sure an updated snapshot can't silently drop a directive that matters.

import { describe, expect, it } from 'vitest';
import { MARKER, renderAll, renderGlobal, renderSite } from '../../../src/reconcilers/nginx/render.js';
import { buildViews, type SiteView, type ViewOptions } from '../../../src/reconcilers/nginx/view.js';
import { sampleState } from './fixtures.js';

const opts: ViewOptions = {
  httpPort: 80,
  httpsPort: 443,
  acmeWebroot: '/var/lib/dstack-proxy/acme',
  accessLogPath: '/var/log/dstack-proxy/access.log',
  certFor: (d) =>
    d === 'llama-8b.gw.test' || d === 'gateway.gw.test'
      ? { certPath: `/certs/${d}/fullchain.pem`, keyPath: `/certs/${d}/privkey.pem` }
      : null,
  upstreamFor: (s) =>
    s.run === 'plain'
      ? { kind: 'socket', path: '/run/dstack-proxy/main.plain.sock' }
      : { kind: 'direct', servers: s.replicas.flatMap((r) => (r.direct ? [`${r.direct.host}:${r.direct.port}`] : [])) },
  internalSocket: '/var/lib/dstack-proxy/nginx-internal/nginx.sock',
  entrypointKeyInclude: '/var/lib/dstack-proxy/nginx-internal/entrypoint-key.conf',
};
const views = buildViews(sampleState(8001), opts);
const site = (domain: string): SiteView => {
  const s = views.sites.find((x) => x.domain === domain);
  if (!s) throw new Error(domain);
  return s;
};
const linesOf = (text: string) => text.split('\n').map((l) => l.trim());

function expectLines(text: string, want: string[]): void {
  const have = new Set(linesOf(text));
  for (const w of want) expect(have, `missing line: ${w}`).toContain(w);
}

/** The top-level `server { … }` blocks of a file, each as its text. */
function serverBlocks(text: string): string[] {
  const out: string[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== 'server {') continue;
    const end = lines.indexOf('}', i);
    out.push(lines.slice(i, end + 1).join('\n'));
    i = end;
  }
  return out;
}

/** The `location <name> { … }` blocks of a server block, by name. */
function locationBlocks(server: string): Map<string, string> {
  const out = new Map<string, string>();
  const re = /^ {4}location (.+) \{\n((?: {8}.*\n|\n)*?) {4}\}$/gm;
  for (const m of server.matchAll(re)) out.set(m[1]!, m[2]!);
  return out;
}

const INTERNAL = 'listen unix:/var/lib/dstack-proxy/nginx-internal/nginx.sock;';

describe('snapshots', () => {
  for (const [name, text] of renderAll(views)) {
    it(name, async () => {
      await expect(text).toMatchFileSnapshot(`./__snapshots__/${name.replace('/', '__')}`);
    });
  }
});

describe('every file', () => {
  it('starts with the marker line and ends with a newline', () => {
    for (const text of renderAll(views).values()) {
      expect(text.split('\n')[0]).toBe(MARKER);
      expect(text.endsWith('}\n')).toBe(true);
    }
  });
  it('is deterministic', () => {
    expect(renderAll(buildViews(sampleState(8001), opts))).toEqual(renderAll(views));
  });
});

describe('ACME challenges asked of the API (peers, or a fleet sharing its certificates)', () => {
  const asked = buildViews(sampleState(8001), { ...opts, acmePeers: true, apiUrl: 'http://127.0.0.1:8080' });
  it('holds each client to a few questions per second: a zone in the global file, the limit in every named location', () => {
    const global = renderGlobal(asked.global);
    expectLines(global, ['limit_req_zone $binary_remote_addr zone=dstack_acme_asks:1m rate=10r/s;']);
    for (const text of [global, ...asked.sites.map((s) => renderSite(s))]) {
      for (const server of serverBlocks(text)) {
        const named = locationBlocks(server).get('@dstack_acme_peers');
        if (named === undefined) continue;
        expectLines(named, ['limit_req zone=dstack_acme_asks burst=20 nodelay;', 'proxy_pass http://127.0.0.1:8080;']);
      }
    }
    expect(renderSite(asked.sites[0]!)).toContain('@dstack_acme_peers');
  });
  it('has neither without them', () => {
    expect([...renderAll(views).values()].join('\n')).not.toContain('dstack_acme_asks');
  });
});

describe('global file', () => {
  const text = renderGlobal(views.global);
  it('defines the stats log format, the hit flag and the upgrade map', () => {
    expectLines(text, [
      "log_format dstack_proxy_stat '$time_iso8601 $host $status $request_time $dstack_replica_hit';",
      'map $host $dstack_replica_hit {',
      'default 0;',
      'map $http_upgrade $dstack_connection_upgrade {',
      'default upgrade;',
      "'' '';",
    ]);
  });
  it('has a default server: 404 except ACME challenges; TLS handshakes for unknown names rejected', () => {
    expectLines(text, [
      'listen 80 default_server;'.replace('80', '127.0.0.1:80'),
      'location ^~ /.well-known/acme-challenge/ {',
      'root /var/lib/dstack-proxy/acme;',
      'return 404;',
      'listen 127.0.0.1:443 ssl http2 default_server;',
      'ssl_reject_handshake on;',
    ]);
  });
  it('answers unknown hosts on the internal listener with 404 too', () => {
    expectLines(text, ['listen unix:/var/lib/dstack-proxy/nginx-internal/nginx.sock default_server;']);
  });
  it('believes X-Real-IP from the internal listener only, once for every site', () => {
    expect(text.split('\n')).toContain('set_real_ip_from unix:;');
    expect(renderGlobal({ ...views.global, listenInternal: null })).not.toContain('set_real_ip_from');
    for (const [name, site] of renderAll(views)) if (name !== views.global.fileName) expect(site).not.toContain('set_real_ip_from');
  });
  it('can leave the default server and hash sizes to the operator', () => {
    const t = renderGlobal({ ...views.global, defaultServer: false, serverNamesHash: true });
    // The public ports' default is the operator's; the internal listener clashes with no one.
    expect(t.split('\n').filter((line) => line.includes('default_server'))).toEqual([
      '    listen unix:/var/lib/dstack-proxy/nginx-internal/nginx.sock default_server;',
    ]);
    expect(t).not.toContain('ssl_reject_handshake');
    expectLines(t, ['server_names_hash_bucket_size 128;', 'server_names_hash_max_size 65536;']);
    const noInternal = renderGlobal({ ...views.global, defaultServer: false, listenInternal: null });
    expect(noInternal).not.toContain('default_server');
  });
});

describe('service site', () => {
  const text = renderSite(site('llama-8b.gw.test'));
  it('listens on HTTP and, with a Ready cert, HTTPS', () => {
    expectLines(text, [
      'server_name llama-8b.gw.test;',
      'listen 127.0.0.1:80;',
      'listen 127.0.0.1:443 ssl http2;',
      'ssl_certificate /certs/llama-8b.gw.test/fullchain.pem;',
      'ssl_certificate_key /certs/llama-8b.gw.test/privkey.pem;',
      'return 301 https://$host$request_uri;',
      'if ($uri ~ "^/\\.well-known/acme-challenge/") {',
    ]);
  });
  it('trusts no source address: no allow/satisfy, no redirect exemption by address, no realip on the public server', () => {
    for (const t of renderAll(views).values()) {
      expect(t).not.toMatch(/\ballow\b|\bsatisfy\b|\$remote_addr =|127\.0\.0\.1;/);
    }
    const [pub] = serverBlocks(text);
    expect(pub).not.toContain('set_real_ip_from');
    expect(pub).not.toContain('real_ip_header');
    expect(pub).not.toContain('unix:/var/lib/dstack-proxy/nginx-internal');
  });
  it('renders HTTP only without a Ready cert', () => {
    const t = renderSite(site('empty.gw.test'));
    expect(t).not.toContain('ssl');
    expect(t).not.toContain('return 301');
  });
  it('limits body size, rate-limits per prefix with 429', () => {
    expectLines(text, [
      'client_max_body_size 1048576;',
      'limit_req_zone $binary_remote_addr zone=ufc32f1ad.main.llama-8b.0.binary_remote_addr:10m rate=10r/s;',
      'limit_req_zone $binary_remote_addr zone=ufc32f1ad.main.llama-8b.1.binary_remote_addr:10m rate=150r/m;',
      'limit_req_zone $http_x_api_key zone=ufc32f1ad.main.llama-8b.2.http_x_api_key:10m rate=6r/m;',
      'location / {',
      'location /v1/chat {',
      'limit_req zone=ufc32f1ad.main.llama-8b.1.binary_remote_addr burst=5 nodelay;',
      'limit_req zone=ufc32f1ad.main.llama-8b.2.http_x_api_key;',
      'limit_req_status 429;',
    ]);
  });
  it('authenticates every public location with auth_request, and strips the token', () => {
    const [pub] = serverBlocks(text);
    const locs = locationBlocks(pub!);
    for (const prefix of ['/', '/v1/chat']) expect(locs.get(prefix), prefix).toContain('auth_request /_dstack_auth;');
    expectLines(text, [
      'auth_request /_dstack_auth;',
      'location = /_dstack_auth {',
      'internal;',
      'proxy_pass http://127.0.0.1:8000/api/auth/main;',
      'proxy_pass_request_body off;',
      'proxy_set_header Authorization $http_authorization;',
      'proxy_set_header Authorization "";',
    ]);
  });
  it('proxies to a keepalive upstream with forwarded and upgrade headers, and flags the hit', () => {
    expectLines(text, [
      'upstream ufc32f1ad.main.llama-8b {',
      'server 127.0.0.1:8001;',
      'keepalive 64;',
      'try_files /nonexistent @dstack_replica;',
      'location @dstack_replica {',
      'set $dstack_replica_hit 1;',
      'proxy_pass http://ufc32f1ad.main.llama-8b;',
      'proxy_http_version 1.1;',
      'proxy_set_header Host $host;',
      'proxy_set_header X-Real-IP $remote_addr;',
      'proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;',
      'proxy_set_header X-Forwarded-Proto $scheme;',
      'proxy_set_header Upgrade $http_upgrade;',
      'proxy_set_header Connection $dstack_connection_upgrade;',
      'proxy_read_timeout 300s;',
      'access_log /var/log/dstack-proxy/access.log dstack_proxy_stat;',
    ]);
  });
  it('adds CORS for OpenAI models', () => {
    expectLines(text, ['add_header Access-Control-Allow-Origin * always;', 'return 204;']);
    expect(renderSite(site('empty.gw.test'))).not.toContain('Access-Control');
  });
  it('answers 503 with JSON when there is no upstream', () => {
    const t = renderSite(site('empty.gw.test'));
    expectLines(t, ['default_type application/json;', `return 503 '{"detail":"Service main/empty has no ready replica"}';`]);
    expect(t).not.toContain('upstream');
  });
  it("serves the gateway's model API on the internal listener: same limits and replica, no auth, address from X-Real-IP", () => {
    const blocks = serverBlocks(text);
    expect(blocks).toHaveLength(2);
    const internal = blocks[1]!;
    expectLines(internal, [
      'server_name llama-8b.gw.test;',
      INTERNAL,
      'real_ip_header X-Real-IP;',
      'limit_req_status 429;',
      'access_log /var/log/dstack-proxy/access.log dstack_proxy_stat;',
      'client_max_body_size 1048576;',
      'limit_req zone=ufc32f1ad.main.llama-8b.0.binary_remote_addr burst=20 nodelay;',
      'limit_req zone=ufc32f1ad.main.llama-8b.1.binary_remote_addr burst=5 nodelay;',
      'limit_req zone=ufc32f1ad.main.llama-8b.2.http_x_api_key;',
      'proxy_pass http://ufc32f1ad.main.llama-8b;',
      'proxy_set_header X-Real-IP $remote_addr;',
      'proxy_set_header X-Forwarded-For $http_x_forwarded_for;',
      'proxy_set_header Authorization "";',
    ]);
    // Only the internal server listens there, and it is the only one without the checks.
    expect(internal.match(/^ {4}listen /gm)).toHaveLength(1);
    expect(internal).not.toContain('auth_request');
    expect(internal).not.toContain('return 301');
    expect(internal).not.toContain('listen 127.0.0.1');
    expect([...locationBlocks(internal).keys()].sort()).toEqual(['/', '/v1/chat', '@dstack_replica', '@dstack_timeout']);
    // Every service site has one, proxying to its own upstream or answering 503.
    expectLines(renderSite(site('plain.gw.test')), [INTERNAL, 'proxy_pass http://u6ca26a5a.main.plain;']);
    expectLines(renderSite(site('empty.gw.test')), [INTERNAL, 'default_type application/json;']);
  });
  it('gives try_files a root the workers can enter (the ACME webroot), on both servers', () => {
    for (const server of serverBlocks(text)) expect(linesOf(server)).toContain('root /var/lib/dstack-proxy/acme;');
  });
  it('renders no internal server without an internal socket', () => {
    const t = renderAll(buildViews(sampleState(8001), { ...opts, internalSocket: null }));
    for (const text of t.values()) expect(text).not.toContain('unix:/var/lib/dstack-proxy/nginx-internal');
  });
  it('renders a Unix-socket upstream', () => {
    expectLines(renderSite(site('plain.gw.test')), ['server unix:/run/dstack-proxy/main.plain.sock;', 'keepalive 64;']);
  });
});

describe('shared data-plane upstream (the gateway)', () => {
  const shared = buildViews(sampleState(8001), {
    ...opts,
    upstreamFor: () => ({ kind: 'shared' }),
    dataplaneSocket: '/var/lib/dstack-proxy/sockets/dataplane.sock',
  });
  const files = renderAll(shared);
  const global = files.get(shared.global.fileName)!;
  const sharedSite = (domain: string): string => renderSite(shared.sites.find((x) => x.domain === domain)!);

  it.each([shared.global.fileName, 'sites/llama-8b.gw.test.conf', 'sites/empty.gw.test.conf'])('snapshot %s', async (name) => {
    await expect(files.get(name)).toMatchFileSnapshot(`./__snapshots__/shared__${name.replace('/', '__')}`);
  });

  it('declares one upstream of the shared socket in the global file', () => {
    expectLines(global, [
      'upstream dstack_dataplane {',
      'server unix:/var/lib/dstack-proxy/sockets/dataplane.sock;',
      'keepalive 1024;',
      'keepalive_time 1h;',
    ]);
    expect(global.match(/^upstream /gm)).toHaveLength(1);
    expect(renderGlobal(views.global)).not.toContain('upstream');
  });

  it('sends every service site to it, naming the service on both servers; no upstream of their own', () => {
    for (const [domain, key] of [
      ['llama-8b.gw.test', 'main/llama-8b'],
      ['plain.gw.test', 'main/plain'],
      // No replica: the data plane answers its 503, as it does when replicas go away between reloads.
      ['empty.gw.test', 'main/empty'],
    ] as const) {
      const t = sharedSite(domain);
      expect(t).not.toMatch(/^upstream /m);
      expect(t).not.toContain('return 503');
      const blocks = serverBlocks(t);
      expect(blocks).toHaveLength(2);
      for (const server of blocks) {
        const replica = locationBlocks(server).get('@dstack_replica')!;
        expectLines(replica, [
          'set $dstack_replica_hit 1;',
          'proxy_pass http://dstack_dataplane;',
          'proxy_http_version 1.1;',
          `proxy_set_header X-Dstack-Proxy-Service ${key};`,
          'proxy_set_header Connection $dstack_connection_upgrade;',
        ]);
      }
    }
  });

  it('refuses a shared target without the socket', () => {
    expect(() => buildViews(sampleState(8001), { ...opts, upstreamFor: () => ({ kind: 'shared' }) })).toThrow(/dataplaneSocket/);
  });
});

describe('entrypoint site', () => {
  const text = renderSite(site('gateway.gw.test'));
  it('proxies everything to the project model API with the same TLS logic', () => {
    expectLines(text, [
      'server_name gateway.gw.test;',
      'listen 127.0.0.1:443 ssl http2;',
      'return 301 https://$host$request_uri;',
      'location / {',
      'proxy_pass http://127.0.0.1:8000/api/models/main/;',
      'proxy_buffering off;',
      'proxy_set_header X-Real-IP $remote_addr;',
      'include /var/lib/dstack-proxy/nginx-internal/entrypoint-key.conf;',
    ]);
    // The model API does not need it on the internal listener: it calls services, not itself.
    expect(text).not.toContain('unix:');
  });
});
