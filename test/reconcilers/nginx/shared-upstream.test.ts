// The gateway's wiring on a real Nginx: every service site proxies to the one data-plane upstream
// and names its service in X-Dstack-Proxy-Service; the balancer's shared socket routes by it. A
// client cannot pick another service by sending the header itself (proxy_set_header replaces it),
// on plain requests and on upgrades, and the replica never sees it.

import type { Server } from 'node:http';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, Replicas, SERVICE_HEADER } from '../../../src/dataplane/index.js';
import { applyFiles, diffFiles, readOwned } from '../../../src/reconcilers/nginx/apply.js';
import { renderAll } from '../../../src/reconcilers/nginx/render.js';
import { buildViews } from '../../../src/reconcilers/nginx/view.js';
import { emptyState } from '../../../src/spec/types.js';
import { close, request, startEcho } from '../../helpers/http.js';
import { startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { freePorts } from '../../helpers/ports.js';
import { tmpDir } from '../../helpers/tmp.js';
import { tcpUpstream } from '../../helpers/replicas.js';
import { service } from './fixtures.js';

/** Raw bytes to Nginx's HTTP port; what came back by the time it closed (or after `ms`). */
function rawNginx(port: number, bytes: string, ms = 5_000): Promise<string> {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port });
    let text = '';
    const done = (): void => {
      clearTimeout(timer);
      s.destroy();
      resolve(text);
    };
    const timer = setTimeout(done, ms);
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      if (text.includes('\r\n\r\n')) done();
    });
    s.on('error', done);
    s.once('close', done);
    s.write(bytes);
  });
}

type Echo = { name: string; headers: Record<string, string | undefined> };

let tmp: ReturnType<typeof tmpDir>;
let ng: TestNginx;
let echoes: Server[];
let replicas: Replicas;
let balancer: Balancer;

beforeAll(async () => {
  tmp = tmpDir('dp-ng-shared-');
  ng = await startTestNginx();
  const ports = await freePorts(2);
  echoes = await Promise.all(ports.map((p, i) => startEcho(`app${i}`, { port: p })));
  replicas = new Replicas();
  replicas.set('main/a', 'r0', tcpUpstream(ports[0]!));
  replicas.set('other/service', 'r1', tcpUpstream(ports[1]!));
  balancer = new Balancer({ socketDir: join(tmp.dir, 'sockets'), replicas, shared: true });
  expect(await balancer.listenAll(['main/a', 'other/service', 'main/empty'])).toEqual(new Map());

  const state = emptyState();
  state.spec.services = [
    service({ run: 'a', domain: 'a.gw.test', replicas: [] }),
    service({ project: 'other', run: 'service', domain: 'other.gw.test', replicas: [] }),
    service({ run: 'empty', domain: 'empty.gw.test', replicas: [] }),
  ];
  const views = buildViews(state, {
    httpPort: ng.httpPort,
    httpsPort: ng.httpsPort,
    acmeWebroot: ng.acmeWebroot,
    accessLogPath: ng.accessLogPath,
    upstreamFor: () => ({ kind: 'shared' }),
    dataplaneSocket: balancer.sharedSocketPath,
  });
  const changes = diffFiles(renderAll(views), await readOwned(ng.paths.confDir));
  const r = await applyFiles({ changes, sitesDir: ng.paths.confDir, mainConfPath: ng.paths.confPath, test: ng.test, reload: ng.reload });
  expect(r.heldBack).toEqual([]);
  expect(r.reloaded).toBe(true);
});

afterAll(async () => {
  await ng?.stop();
  await balancer?.close();
  await replicas?.close();
  await Promise.all((echoes ?? []).map(close));
  tmp?.cleanup();
});

describe('Nginx → the shared data-plane socket', () => {
  it('routes each site to its own service', async () => {
    const a = await request({ port: ng.httpPort, host: 'a.gw.test' });
    const o = await request({ port: ng.httpPort, host: 'other.gw.test' });
    expect((JSON.parse(a.body) as Echo).name).toBe('app0');
    expect((JSON.parse(o.body) as Echo).name).toBe('app1');
  });

  it('a client-sent X-Dstack-Proxy-Service still reaches the site’s own service, and the replica never sees one', async () => {
    for (const value of ['other/service', 'main/a', '']) {
      const r = await request({ port: ng.httpPort, host: 'a.gw.test', headers: { [SERVICE_HEADER]: value } });
      expect(r.status).toBe(200);
      const echo = JSON.parse(r.body) as Echo;
      expect(echo.name).toBe('app0');
      expect(echo.headers['x-dstack-proxy-service']).toBeUndefined();
    }
  });

  it('and so does a client sending it twice, in another case', async () => {
    const r = await rawNginx(
      ng.httpPort,
      `GET / HTTP/1.1\r\nHost: a.gw.test\r\nx-dstack-proxy-service: other/service\r\nX-DSTACK-PROXY-SERVICE: other/service\r\nConnection: close\r\n\r\n`,
    );
    expect(r).toMatch(/^HTTP\/1\.1 200 /);
    expect(r).toContain('"name":"app0"');
  });

  it('pins an upgrade with a forged header to the site’s own service', async () => {
    const r = await rawNginx(
      ng.httpPort,
      `GET /ws HTTP/1.1\r\nHost: a.gw.test\r\n${SERVICE_HEADER}: other/service\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n`,
    );
    expect(r).toMatch(/^HTTP\/1\.1 101 /);
    expect(r).toContain('X-Echo: app0');
  });

  it('passes the data plane’s 503 for a service without a replica', async () => {
    const r = await request({ port: ng.httpPort, host: 'empty.gw.test', headers: { [SERVICE_HEADER]: 'main/a' } });
    expect(r.status).toBe(503);
    expect(r.headers['content-type']).toBe('application/json');
    expect(JSON.parse(r.body)).toEqual({ detail: 'Service main/empty has no ready replica' });
  });

  it('carries every site on one keep-alive pool: few connections for many requests to several services', async () => {
    const accepted = balancer.stats.accepted;
    for (let i = 0; i < 30; i++) {
      const host = ['a.gw.test', 'other.gw.test', 'empty.gw.test'][i % 3]!;
      await request({ port: ng.httpPort, host });
    }
    // One worker, sequential requests: its pooled connection is reused across services.
    expect(balancer.stats.accepted - accepted).toBeLessThanOrEqual(1);
  });
});
