// Nginx → the data plane's shared socket → ssh2 → sshd → app, with both loops under one
// controller the way the gateway wires them: a replica added to a running service receives connections and
// Nginx is not reloaded; with no Ready replica Nginx passes the balancer's 503 JSON through.

import type { Server } from 'node:http';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Controller } from '../../../src/reconcilers/controller.js';
import { createNginxLoop } from '../../../src/reconcilers/nginx/loop.js';
import { createSshLoop, SSH_LOOP, type SshLoop } from '../../../src/reconcilers/ssh/index.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import type { ProxyState, Replica } from '../../../src/spec/types.js';
import { close, request, startEcho } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { freePorts } from '../../helpers/ports.js';
import { startSshdChain, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { specOf } from './harness.js';

let tmp: ReturnType<typeof tmpDir>;
let ng: TestNginx;
let key: ClientKey;
let sshd: TestSshd;
let stopSshds: () => Promise<void>;
let echoes: Server[];
let ports: number[];
let ssh: SshLoop;
let nginx: ReturnType<typeof createNginxLoop>;
let controller: Controller;
let current: { state: ProxyState; generation: number };

const replica = (id: string, app: number, port = sshd.port): Replica => ({
  id,
  appPort: ports[app]!,
  ssh: { host: '127.0.0.1', port, user: sshd.user },
});
function spec(replicas: Replica[], down: Replica[] = []): ProxyState {
  const s = specOf(key.privateKey, { app: replicas, down });
  s.spec.services[0]!.domain = 'app.gw.test';
  s.spec.services[1]!.domain = 'down.gw.test';
  return s;
}
async function put(state: ProxyState): Promise<void> {
  current = { state, generation: current.generation + 1 };
  controller.notify();
  await controller.whenIdle();
}
const get = (host: string): ReturnType<typeof request> => request({ port: ng.httpPort, host });

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-ng-');
  const chain = await startSshdChain(tmp.dir, 1);
  key = chain.key;
  sshd = chain.sshds[0]!;
  stopSshds = chain.stop;
  ports = await freePorts(2);
  echoes = await Promise.all(ports.map((p, i) => startEcho(`app${i}`, { port: p })));
  ng = await startTestNginx();
  ssh = createSshLoop({ stateDir: tmp.dir, sharedSocket: true, probeIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } });
  nginx = createNginxLoop({
    confDir: ng.paths.confDir,
    mainConfPath: ng.paths.confPath,
    test: ng.test,
    reload: ng.reload,
    view: {
      httpPort: ng.httpPort,
      httpsPort: ng.httpsPort,
      acmeWebroot: ng.acmeWebroot,
      accessLogPath: ng.accessLogPath,
      dataplaneSocket: ssh.balancer.sharedSocketPath,
    },
    upstreamFor: () => ({ kind: 'shared' }),
    dependsOn: [SSH_LOOP],
  });
  current = { state: spec([replica('r0', 0)], [replica('x0', 0, 1)]), generation: 1 };
  controller = new Controller({ loops: [ssh, nginx] as unknown as AnyLoop[], getSpec: () => current, logger: pino({ level: 'silent' }) });
  await controller.start();
});

afterAll(async () => {
  await controller?.stop();
  await ssh?.close();
  await ng?.stop();
  await stopSshds?.();
  await Promise.all((echoes ?? []).map(close));
  tmp?.cleanup();
});

describe('nginx → balancer → ssh', () => {
  it('serves the service through its SSH replica', async () => {
    const r = await eventually(async () => {
      const res = await get('app.gw.test');
      return res.status === 200 ? res : undefined;
    });
    expect(JSON.parse(r.body)).toMatchObject({ name: 'app0' });
  });

  it('answers 503 JSON through Nginx when no replica is Ready', async () => {
    const r = await get('down.gw.test');
    expect(r.status).toBe(503);
    expect(r.headers['content-type']).toBe('application/json');
    expect(JSON.parse(r.body)).toEqual({ detail: 'Service main/down has no ready replica' });
  });

  it('an added replica receives requests without an Nginx reload', async () => {
    const reloads = nginx.stats.reloads;
    await put(spec([replica('r0', 0), replica('r1', 1)], [replica('x0', 0, 1)]));
    expect(nginx.stats.reloads).toBe(reloads);
    // Nginx's pooled connections to the socket are not tied to r0: the balancer chooses per request.
    const seen = await eventually(async () => {
      const replies = await Promise.all(Array.from({ length: 16 }, () => get('app.gw.test')));
      for (const r of replies) expect(r.status).toBe(200);
      const names = new Set(replies.map((r) => (JSON.parse(r.body) as { name: string }).name));
      return names.has('app1') ? names : undefined;
    }, 20_000);
    expect(seen.has('app1')).toBe(true);
    expect(nginx.stats.reloads).toBe(reloads);
  });
});
