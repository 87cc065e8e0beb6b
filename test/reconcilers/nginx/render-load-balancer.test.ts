// The gateway behind a load balancer, as rendered: with no trusted proxies and no health answer
// every file is byte for byte what it was; with them, real_ip and the forwarded-proto map in the
// global file only, the sites naming just the variable; addresses checked before they get there.

import { describe, expect, it } from 'vitest';
import { ProxyError } from '../../../src/errors.js';
import { resolveOptions } from '../../../src/gateway/options.js';
import { renderAll, renderGlobal, renderSite } from '../../../src/reconcilers/nginx/render.js';
import { MAX_TRUSTED_PROXIES, parseTrustedProxies } from '../../../src/reconcilers/nginx/trusted-proxies.js';
import { buildViews, type SiteView, type ViewOptions } from '../../../src/reconcilers/nginx/view.js';
import { sampleState, service } from './fixtures.js';

const opts: ViewOptions = {
  httpPort: 80,
  httpsPort: 443,
  acmeWebroot: '/var/lib/dstack-proxy/acme',
  accessLogPath: '/var/log/dstack-proxy/access.log',
  certFor: (d) => (d === 'llama-8b.gw.test' || d === 'gateway.gw.test' ? { certPath: `/c/${d}/f.pem`, keyPath: `/c/${d}/k.pem` } : null),
  internalSocket: '/var/lib/dstack-proxy/nginx-internal/nginx.sock',
  entrypointKeyInclude: '/var/lib/dstack-proxy/nginx-internal/entrypoint-key.conf',
};
const PROXIES = ['10.0.0.0/16', '192.0.2.7', '2001:db8::/32'];
const off = renderAll(buildViews(sampleState(), opts));
const onViews = buildViews(sampleState(), { ...opts, trustedProxies: PROXIES, healthCheck: true });
const on = renderAll(onViews);

const lines = (text: string) => text.split('\n').map((l) => l.trim());
function expectLines(text: string, want: string[]): void {
  const have = new Set(lines(text));
  for (const w of want) expect(have, `missing line: ${w}`).toContain(w);
}
function site(domain: string): SiteView {
  const s = onViews.sites.find((x) => x.domain === domain);
  if (!s) throw new Error(domain);
  return s;
}
/** The public `server { … }` block of a site file (the first), and the internal one (the second). */
function servers(text: string): string[] {
  const out: string[] = [];
  const ls = text.split('\n');
  for (let i = 0; i < ls.length; i++) {
    if (ls[i] !== 'server {') continue;
    const end = ls.indexOf('}', i);
    out.push(ls.slice(i, end + 1).join('\n'));
    i = end;
  }
  return out;
}

describe('off (the default)', () => {
  it('renders every file exactly as without the options', () => {
    expect(renderAll(buildViews(sampleState(), { ...opts, trustedProxies: [], healthCheck: false }))).toEqual(off);
  });
  it('keeps $scheme and the appended X-Forwarded-For, no real_ip at http level, 404 on /', () => {
    const global = off.get('00-dstack-proxy-global.conf')!;
    // Only the internal listener's peer is trusted, for its X-Real-IP.
    expect(global.match(/set_real_ip_from .*/g)).toEqual(['set_real_ip_from unix:;']);
    expect(global).not.toMatch(/real_ip_header|\bgeo\b|dstack_forwarded_proto|location = \//);
    for (const [name, text] of off) {
      if (name.startsWith('00-') || name.includes('empty')) continue; // empty: no replica, a 503 of its own
      expect(text).not.toContain('$dstack_forwarded_proto');
      expect(servers(text)[0]).toContain('proxy_set_header X-Forwarded-Proto $scheme;');
      expect(servers(text)[0]).toContain('proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;');
    }
  });
});

describe('--trusted-proxies', () => {
  const global = on.get('00-dstack-proxy-global.conf')!;
  it('puts real_ip from each proxy at http level: client from X-Forwarded-For, recursively', () => {
    expectLines(global, [
      'set_real_ip_from 10.0.0.0/16;',
      'set_real_ip_from 192.0.2.7;',
      'set_real_ip_from 2001:db8::/32;',
      'real_ip_header X-Forwarded-For;',
      'real_ip_recursive on;',
    ]);
  });
  it('keeps X-Forwarded-Proto only from a trusted peer and only http or https, else $scheme', () => {
    expect(global).toContain(
      [
        'geo $realip_remote_addr $dstack_trusted_peer {',
        '    default 0;',
        '    10.0.0.0/16 1;',
        '    192.0.2.7 1;',
        '    2001:db8::/32 1;',
        '}',
        '',
        'map "$dstack_trusted_peer:$http_x_forwarded_proto" $dstack_forwarded_proto {',
        '    default $scheme;',
        '    "1:http" http;',
        '    "1:https" https;',
        '}',
      ].join('\n'),
    );
  });
  it('sends replicas and the model API the client alone as X-Forwarded-For, and the mapped proto', () => {
    for (const domain of ['llama-8b.gw.test', 'plain.gw.test', 'empty.gw.test', 'gateway.gw.test']) {
      const [pub] = servers(renderSite(site(domain)));
      if (domain === 'empty.gw.test') {
        expect(pub).not.toContain('proxy_set_header'); // no replica: a 503 of its own
        continue;
      }
      expectLines(pub!, [
        'proxy_set_header X-Real-IP $remote_addr;',
        'proxy_set_header X-Forwarded-For $remote_addr;',
        'proxy_set_header X-Forwarded-Proto $dstack_forwarded_proto;',
      ]);
      expect(pub).not.toContain('$proxy_add_x_forwarded_for');
      expect(pub).not.toContain('X-Forwarded-Proto $scheme');
    }
  });
  it('does not redirect to HTTPS what reached the load balancer over HTTPS', () => {
    expectLines(renderSite(site('llama-8b.gw.test')), ['set $dstack_redirect $dstack_forwarded_proto;']);
  });
  it("leaves the internal listener's server as it was (address from X-Real-IP on the socket only)", () => {
    const internalOn = servers(on.get('sites/llama-8b.gw.test.conf')!)[1];
    const internalOff = servers(off.get('sites/llama-8b.gw.test.conf')!)[1];
    expect(internalOn).toBe(internalOff);
    expectLines(internalOn!, ['real_ip_header X-Real-IP;', 'proxy_set_header X-Forwarded-Proto $http_x_forwarded_proto;']);
  });
  it('names no address in a site file: a new proxy list rewrites the global file only', () => {
    const other = renderAll(buildViews(sampleState(), { ...opts, trustedProxies: ['172.16.0.0/12'], healthCheck: true }));
    for (const [name, text] of on) {
      if (name.startsWith('00-')) expect(other.get(name)).not.toBe(text);
      else expect(other.get(name)).toBe(text);
    }
  });
  it('renders a list with duplicates once', () => {
    const g = renderGlobal(buildViews(sampleState(), { ...opts, trustedProxies: ['192.0.2.7', '192.0.2.7'] }).global);
    expect(g.match(/set_real_ip_from 192\.0\.2\.7;/g)).toHaveLength(1);
  });
});

describe('--health-check-ok', () => {
  it('answers GET / with 200 JSON at the default server; other paths and methods keep 404', () => {
    const global = on.get('00-dstack-proxy-global.conf')!;
    expect(global).toContain(
      [
        '    location = / {',
        '        if ($request_method !~ ^(GET|HEAD)$) {',
        '            return 404;',
        '        }',
        '        default_type application/json;',
        `        return 200 '{"status":"ok"}';`,
        '    }',
        '    location / {',
        '        return 404;',
        '    }',
      ].join('\n'),
    );
    expect(global.match(/location = \//g)).toHaveLength(1); // the HTTP default server only
  });
  it('is independent of the trusted proxies', () => {
    const g = renderGlobal(buildViews(sampleState(), { ...opts, healthCheck: true }).global);
    expect(g).toContain('location = / {');
    expect(g.match(/set_real_ip_from .*/g)).toEqual(['set_real_ip_from unix:;']);
  });
  it('renders nothing without a default server (system Nginx keeps its own)', () => {
    const g = renderGlobal(buildViews(sampleState(), { ...opts, healthCheck: true, defaultServer: false }).global);
    expect(g).not.toContain('location = /');
  });
});

describe('checking the addresses', () => {
  it.each([
    ['', []],
    [' , ', []],
    ['10.0.0.0/8', ['10.0.0.0/8']],
    ['192.0.2.7, 192.0.2.7 ,2001:db8::/32', ['192.0.2.7', '2001:db8::/32']],
    ['0.0.0.0/0,::/0', ['0.0.0.0/0', '::/0']],
    ['::ffff:10.0.0.0/104', ['::ffff:10.0.0.0/104']],
    ['2001:db8::1/128,fd00::/8', ['2001:db8::1/128', 'fd00::/8']],
  ])('accepts %j', (raw, want) => {
    expect(parseTrustedProxies(raw)).toEqual(want);
  });

  it.each([
    ['10.0.0.300', 'is not an IPv4 or IPv6 address'],
    ['10.0.0', 'is not an IPv4 or IPv6 address'],
    ['010.0.0.1', 'is not an IPv4 or IPv6 address'],
    ['example.com', 'is not an IPv4 or IPv6 address'],
    ['[2001:db8::1]', 'is not an IPv4 or IPv6 address'],
    ['fe80::1%eth0', 'is not an IPv4 or IPv6 address'],
    ['10.0.0.0/8; include /etc/shadow', 'has a bad prefix length'],
    ['10.0.0.1;', 'is not an IPv4 or IPv6 address'],
    ['10.0.0.1 1', 'is not an IPv4 or IPv6 address'],
    ['10.0.0.1\n1', 'is not an IPv4 or IPv6 address'],
    ['$remote_addr', 'is not an IPv4 or IPv6 address'],
    ['unix:', 'is not an IPv4 or IPv6 address'],
    ['10.0.0.0/33', 'has a bad prefix length (0 to 32 for IPv4)'],
    ['10.0.0.0/', 'has a bad prefix length'],
    ['10.0.0.0/08', 'has a bad prefix length'],
    ['10.0.0.0/-1', 'has a bad prefix length'],
    ['10.0.0.0/8/8', 'has a bad prefix length'],
    ['2001:db8::/129', 'has a bad prefix length (0 to 128 for IPv6)'],
    ['10.1.0.0/8', 'has bits set beyond its /8 prefix'],
    ['2001:db8::1/64', 'has bits set beyond its /64 prefix'],
    ['::ffff:10.0.0.1/104', 'has bits set beyond its /104 prefix'],
  ])('refuses %j, naming it', (raw, why) => {
    let err: unknown;
    try {
      parseTrustedProxies(`192.0.2.1,${raw}`);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ProxyError);
    expect((err as ProxyError).code).toBe('DP_ERR_BAD_OPTION');
    expect((err as Error).message).toContain(`--trusted-proxies: ${JSON.stringify(raw.trim())} ${why}`);
  });

  it(`refuses more than ${MAX_TRUSTED_PROXIES} entries`, () => {
    const many = Array.from({ length: MAX_TRUSTED_PROXIES + 1 }, (_, i) => `10.${i >> 8}.${i & 255}.1`).join(',');
    expect(() => parseTrustedProxies(many)).toThrow(/at most 256/);
  });

  it('stops the start on a bad --trusted-proxies, and takes a good one from the environment', () => {
    expect(() => resolveOptions({ flags: { trustedProxies: '10.0.0.0/8,10.0.0.999' } })).toThrow(/"10\.0\.0\.999" is not an IPv4/);
    expect(resolveOptions({ env: { DSTACK_PROXY_TRUSTED_PROXIES: '10.0.0.0/8' } }).trustedProxies).toBe('10.0.0.0/8');
    expect(resolveOptions({}).trustedProxies).toBe('');
    expect(resolveOptions({}).healthCheckOk).toBe('false');
    expect(() => resolveOptions({ flags: { healthCheckOk: 'yes' } })).toThrow(/--health-check-ok: must be one of true, false/);
  });

  it('checks again when building the views: nothing unchecked reaches the config', () => {
    expect(() => buildViews(sampleState(), { ...opts, trustedProxies: ['10.0.0.0/8 1; include /x'] })).toThrow(ProxyError);
  });
});

describe('cost', () => {
  it('adds nothing per service but the two header lines', () => {
    const state = sampleState();
    state.spec.services = [
      service({ run: 'one', domain: 'one.gw.test', replicas: [{ id: 'r', appPort: 1, direct: { host: '127.0.0.1', port: 1 } }] }),
    ];
    state.spec.entrypoints = [];
    const a = renderAll(buildViews(state, opts)).get('sites/one.gw.test.conf')!;
    const b = renderAll(buildViews(state, { ...opts, trustedProxies: PROXIES })).get('sites/one.gw.test.conf')!;
    expect(lines(a).length).toBe(lines(b).length);
  });
});
