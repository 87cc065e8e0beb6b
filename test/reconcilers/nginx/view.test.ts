import { describe, expect, it } from 'vitest';
import { buildViews, type ServiceSiteView, type ViewOptions } from '../../../src/reconcilers/nginx/view.js';
import { sampleState, service } from './fixtures.js';

const opts: ViewOptions = { httpPort: 80, httpsPort: 443, acmeWebroot: '/w', accessLogPath: '/l/a.log' };

function svc(views: ReturnType<typeof buildViews>, domain: string): ServiceSiteView {
  const s = views.sites.find((x) => x.domain === domain);
  if (!s || s.kind !== 'service') throw new Error(`no service site ${domain}`);
  return s;
}

describe('buildViews', () => {
  it('makes one site per service domain and per entrypoint, none for in-server-only services', () => {
    const v = buildViews(sampleState(), opts);
    expect(v.sites.map((s) => [s.kind, s.domain, s.fileName])).toEqual([
      ['service', 'empty.gw.test', 'sites/empty.gw.test.conf'],
      ['entrypoint', 'gateway.gw.test', 'sites/gateway.gw.test.conf'],
      ['service', 'llama-8b.gw.test', 'sites/llama-8b.gw.test.conf'],
      ['service', 'plain.gw.test', 'sites/plain.gw.test.conf'],
    ]);
    expect(v.global).toMatchObject({ fileName: '00-dstack-proxy-global.conf', listenHttp: '127.0.0.1:80', listenHttps: '127.0.0.1:443' });
  });

  it('uses direct replicas by default and skips SSH replicas; no replica → no upstream', () => {
    const v = buildViews(sampleState(9000), opts);
    expect(svc(v, 'llama-8b.gw.test').upstream).toEqual({ name: 'ufc32f1ad.main.llama-8b', servers: ['127.0.0.1:9000'] });
    expect(svc(v, 'empty.gw.test').upstream).toBeNull();
  });

  it('renders a per-service Unix socket when upstreamFor says so', () => {
    const v = buildViews(sampleState(), { ...opts, upstreamFor: (s) => ({ kind: 'socket', path: `/run/dp/${s.run}.sock` }) });
    expect(svc(v, 'empty.gw.test').upstream).toEqual({ name: 'ud7ac1361.main.empty', servers: ['unix:/run/dp/empty.sock'] });
  });

  it('adds TLS only for https sites whose certificate is Ready', () => {
    const certFor = (d: string) => (d === 'gateway.gw.test' || d === 'plain.gw.test' ? { certPath: `/c/${d}`, keyPath: `/k/${d}` } : null);
    const v = buildViews(sampleState(), { ...opts, certFor });
    const tls = Object.fromEntries(v.sites.map((s) => [s.domain, s.tls]));
    expect(tls['gateway.gw.test']).toEqual({
      listen: '127.0.0.1:443',
      certPath: '/c/gateway.gw.test',
      keyPath: '/k/gateway.gw.test',
      redirectPort: '',
    });
    expect(tls['plain.gw.test']).toBeNull(); // https: false
    expect(tls['llama-8b.gw.test']).toBeNull(); // https but not Ready
  });

  it('groups rate limits into locations by prefix, always with "/"', () => {
    const v = buildViews(sampleState(), opts);
    const s = svc(v, 'llama-8b.gw.test');
    expect(s.zones.map((z) => [z.key, z.rate])).toEqual([
      ['$binary_remote_addr', '10r/s'],
      ['$binary_remote_addr', '150r/m'],
      ['$http_x_api_key', '6r/m'],
    ]);
    expect(s.locations.map((l) => [l.prefix, l.limits.map((x) => x.burst)])).toEqual([
      ['/', [20]],
      ['/v1/chat', [5, 0]],
    ]);
    expect(svc(v, 'plain.gw.test').locations).toEqual([{ prefix: '/', limits: [] }]);
  });

  it('sets auth, CORS and body size from the service', () => {
    const v = buildViews(sampleState(), { ...opts, apiUrl: 'http://127.0.0.1:9999' });
    const s = svc(v, 'llama-8b.gw.test');
    expect(s).toMatchObject({ authUrl: 'http://127.0.0.1:9999/api/auth/main', cors: true, clientMaxBodySize: 1048576 });
    expect(svc(v, 'plain.gw.test')).toMatchObject({ authUrl: null, cors: false });
    const ep = v.sites.find((x) => x.kind === 'entrypoint');
    expect(ep).toMatchObject({ target: 'http://127.0.0.1:9999/api/models/main/' });
  });

  it('listens on every address when listenHost is empty and redirects to a non-443 port', () => {
    const v = buildViews(sampleState(), { ...opts, listenHost: '', httpsPort: 8443, certFor: () => ({ certPath: 'c', keyPath: 'k' }) });
    expect(v.global.listenHttp).toBe('80');
    expect(v.sites.find((s) => s.domain === 'gateway.gw.test')?.tls).toMatchObject({ listen: '8443', redirectPort: ':8443' });
  });

  it.each([
    [{ httpPort: 0 }, /httpPort/],
    [{ apiUrl: 'http://127.0.0.1:8000/x' }, /apiUrl/],
    [{ apiUrl: 'http://a;b' }, /apiUrl/],
    [{ proxyReadTimeoutSec: 0 }, /proxyReadTimeoutSec/],
  ])('refuses bad options %j', (bad, re) => {
    expect(() => buildViews(sampleState(), { ...opts, ...bad })).toThrow(re);
  });

  it('refuses a domain used twice', () => {
    const s = sampleState();
    s.spec.services.push(service({ run: 'dup', domain: 'gateway.gw.test' }));
    expect(() => buildViews(s, opts)).toThrow(/duplicate domain/);
  });
});
