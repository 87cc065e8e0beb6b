// The gateway end to end: startGateway() in-process with its real private Nginx, documents PUT
// through the API, requests through Nginx to small HTTP replicas on 127.0.0.1.

import { readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { testConfig } from '../../src/reconcilers/nginx/nginx-process.js';
import {
  api,
  changedFiles,
  gatewayDoc,
  putState,
  send,
  siteFile,
  stampTree,
  startTestGateway,
  type SvcInput,
  type TestGateway,
} from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

type Echo = { name: string; url: string };

const echoes: Server[] = [];
let ports: [number, number, number];

beforeAll(async () => {
  ports = (await freePorts(3)) as [number, number, number];
  echoes.push(
    await startEcho('a0', { port: ports[0] }),
    await startEcho('a1', { port: ports[1] }),
    await startEcho('b0', { port: ports[2] }),
  );
});

afterAll(async () => {
  for (const s of echoes) await close(s);
});

/** GET through Nginx with a Host header. */
function viaNginx(t: TestGateway, host: string, path = '/', extra: { method?: string; body?: string } = {}) {
  return send({ port: t.httpPort, host, path, ...extra });
}

async function whoAnswered(t: TestGateway, host: string): Promise<string> {
  const r = await viaNginx(t, host);
  expect(r.status).toBe(200);
  return (JSON.parse(r.body) as Echo).name;
}

interface Gate {
  arrived: Set<string>;
  waiters: (() => void)[];
  timedOut: boolean;
  need: number;
}

function createGate(need: number): Gate {
  return { arrived: new Set(), waiters: [], timedOut: false, need };
}

/** An HTTP replica that answers only once `gate.need` distinct replicas hold a request. */
async function gatedEcho(name: string, gate: Gate): Promise<Server> {
  const srv = createServer((req, res) => {
    req.resume();
    const answer = (): void => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ name, url: req.url }));
    };
    gate.arrived.add(name);
    if (gate.arrived.size >= gate.need) {
      for (const w of gate.waiters.splice(0)) w();
      answer();
      return;
    }
    const timer = setTimeout(() => {
      gate.timedOut = true;
      answer();
    }, 10_000);
    gate.waiters.push(() => {
      clearTimeout(timer);
      answer();
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return srv;
}

describe('data path, idempotency and removal', () => {
  let t: TestGateway;
  const base = (): SvcInput[] => [
    { run: 'alpha', ports: [ports[0], ports[1]] },
    { run: 'beta', ports: [ports[2]], clientMaxBodySize: 1024 },
    { run: 'empty' },
    { run: 'limited', ports: [ports[2]], rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 0.1 }] },
    // auth: true: limit_req (preaccess phase) counts before auth_request (access phase) refuses.
    { run: 'limited-auth', auth: true, ports: [ports[2]], rateLimits: [{ prefix: '/', key: { type: 'ipAddress' }, rps: 0.1 }] },
  ];

  beforeAll(async () => {
    t = await startTestGateway();
    const r = await putState(t, gatewayDoc(base()));
    expect(r.status, r.body).toBe(200);
    expect(r.json.changed).toBe(true);
    expect(r.json.generation).toBe(1);
  });
  afterAll(async () => {
    await t?.cleanup();
  });

  it('reports the generation converged and every site Ready', async () => {
    const status = (await api(t, { path: '/api/v1/status' })).json as {
      generation: number;
      observedGeneration: number;
      ready: boolean;
      loops: Record<
        string,
        { conditions: { type: string; status: string }[]; objects: Record<string, { conditions: { type: string; status: string }[] }> }
      >;
    };
    expect(status).toMatchObject({ generation: 1, observedGeneration: 1, ready: true });
    const nginx = status.loops.nginx!;
    expect(nginx.conditions.find((c) => c.type === 'Ready')).toMatchObject({ status: 'True' });
    expect(Object.keys(nginx.objects).sort()).toEqual([
      'alpha.gw.test',
      'beta.gw.test',
      'empty.gw.test',
      'global',
      'limited-auth.gw.test',
      'limited.gw.test',
    ]);
    for (const [key, { conditions: conds }] of Object.entries(nginx.objects)) {
      expect(
        conds.find((c) => c.type === 'Ready'),
        key,
      ).toMatchObject({ status: 'True' });
    }
  });

  it('routes by Host and spreads concurrent connections over both replicas', async () => {
    // The balancer picks a replica per connection, least active first. Two requests held open
    // at once (the gate answers only when both replicas have one, or after 10 s) must land on
    // different replicas; with both on one, the gate times out and the names repeat.
    const gate = createGate(2);
    const servers = [await gatedEcho('g0', gate), await gatedEcho('g1', gate)];
    try {
      const gated = [...base(), { run: 'gated', ports: servers.map((s) => (s.address() as AddressInfo).port) }];
      expect((await putState(t, gatewayDoc(gated))).status).toBe(200);
      const answers = await Promise.all([whoAnswered(t, 'gated.gw.test'), whoAnswered(t, 'gated.gw.test')]);
      expect(answers.sort()).toEqual(['g0', 'g1']);
      expect(gate.timedOut).toBe(false);
    } finally {
      expect((await putState(t, gatewayDoc(base()))).status).toBe(200);
      for (const srv of servers) await close(srv);
    }
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add(await whoAnswered(t, 'alpha.gw.test'));
    expect([...seen].every((n) => n === 'a0' || n === 'a1')).toBe(true);
    expect(await whoAnswered(t, 'beta.gw.test')).toBe('b0');
    const unknown = await viaNginx(t, 'nobody.gw.test');
    expect(unknown.status).toBe(404);
  });

  it('answers 503 with a JSON detail when a service has no replica', async () => {
    const r = await viaNginx(t, 'empty.gw.test', '/v1/anything');
    expect(r.status).toBe(503);
    expect(r.headers['content-type']).toMatch(/application\/json/);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Service main/empty has no ready replica' });
  });

  it('answers 429 past a rate limit, also to 127.0.0.1 and also on a service with auth', async () => {
    for (const host of ['limited.gw.test', 'limited-auth.gw.test']) {
      // 6 r/m without burst: at most one of two back-to-back requests gets through.
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) statuses.push((await viaNginx(t, host)).status);
      expect(statuses, host).toContain(429);
      expect(statuses.filter((s) => s === 200).length, host).toBeLessThanOrEqual(1);
    }
  });

  it('answers 413 past clientMaxBodySize', async () => {
    const small = await viaNginx(t, 'beta.gw.test', '/upload', { method: 'POST', body: 'x'.repeat(512) });
    expect(small.status).toBe(200);
    const big = await viaNginx(t, 'beta.gw.test', '/upload', { method: 'POST', body: 'x'.repeat(4096) });
    expect(big.status).toBe(413);
  });

  it('a PUT of the same document changes nothing: no file written, no reload', async () => {
    const before = await stampTree(t.gw.paths.confDir);
    const reloads = t.gw.nginxStats.reloads;
    const generation = (await t.gw.store.read()).generation;
    const r = await putState(t, gatewayDoc(base()));
    expect(r.status).toBe(200);
    expect(r.json.changed).toBe(false);
    expect(r.json.generation).toBe(generation);
    await t.gw.controller.reconcileAll(); // even a full pass finds nothing to do
    expect(changedFiles(before, await stampTree(t.gw.paths.confDir))).toEqual([]);
    expect(t.gw.nginxStats.reloads).toBe(reloads);
  });

  it('a change to one service rewrites exactly its file and reloads once', async () => {
    const before = await stampTree(t.gw.paths.confDir);
    const reloads = t.gw.nginxStats.reloads;
    const doc = base();
    doc[1] = { ...doc[1]!, clientMaxBodySize: 8192 };
    const generation = (await t.gw.store.read()).generation;
    const r = await putState(t, gatewayDoc(doc));
    expect(r.json.changed).toBe(true);
    expect(r.json.generation).toBe(generation + 1);
    expect(changedFiles(before, await stampTree(t.gw.paths.confDir))).toEqual(['sites/beta.gw.test.conf']);
    expect(t.gw.nginxStats.reloads).toBe(reloads + 1);
    const big = await viaNginx(t, 'beta.gw.test', '/upload', { method: 'POST', body: 'x'.repeat(4096) });
    expect(big.status).toBe(200);
  });

  it('removing a service deletes its file, and its host answers 404', async () => {
    const reloads = t.gw.nginxStats.reloads;
    const doc = base().filter((s) => s.run !== 'alpha');
    doc[0] = { ...doc[0]!, clientMaxBodySize: 8192 };
    const r = await putState(t, gatewayDoc(doc));
    expect(r.json.changed).toBe(true);
    await expect(readFile(siteFile(t, 'alpha.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });
    expect(t.gw.nginxStats.reloads).toBe(reloads + 1);
    expect((await viaNginx(t, 'alpha.gw.test')).status).toBe(404);
    expect(await whoAnswered(t, 'beta.gw.test')).toBe('b0');
  });
});

describe('drift repair by the periodic resync', () => {
  let t: TestGateway;
  beforeAll(async () => {
    t = await startTestGateway({ resyncInterval: 0.5 });
    const r = await putState(
      t,
      gatewayDoc([
        { run: 'alpha', ports: [ports[0]] },
        { run: 'beta', ports: [ports[2]] },
      ]),
    );
    expect(r.status, r.body).toBe(200);
  });
  afterAll(async () => {
    await t?.cleanup();
  });

  it('restores a hand-edited owned file', async () => {
    const file = siteFile(t, 'alpha.gw.test');
    const original = await readFile(file, 'utf8');
    const reloads = t.gw.nginxStats.reloads;
    const edited = original.replace(/client_max_body_size \d+;/, 'client_max_body_size 1;');
    expect(edited).not.toBe(original);
    await writeFile(file, edited);
    await eventually(async () => ((await readFile(file, 'utf8')) === original ? true : undefined));
    await eventually(() => (t.gw.nginxStats.reloads > reloads ? true : undefined));
    expect(await whoAnswered(t, 'alpha.gw.test')).toBe('a0');
  });

  it('recreates a deleted owned file', async () => {
    const file = siteFile(t, 'beta.gw.test');
    const original = await readFile(file, 'utf8');
    await unlink(file);
    await eventually(async () => ((await readFile(file, 'utf8').catch(() => '')) === original ? true : undefined));
    await eventually(async () => ((await viaNginx(t, 'beta.gw.test')).status === 200 ? true : undefined));
    expect(await whoAnswered(t, 'beta.gw.test')).toBe('b0');
  });

  it('leaves foreign *.conf files alone', async () => {
    const foreignSite = join(t.gw.paths.confDir, 'sites', 'zz-foreign.conf');
    const foreignTop = join(t.gw.paths.confDir, 'zz-operator.conf');
    await writeFile(foreignSite, '# written by the operator\n');
    await writeFile(foreignTop, '# operator tuning\nkeepalive_timeout 30s;\n');
    const before = await stampTree(t.gw.paths.confDir);
    const passes = t.gw.controller.counters().nginx!.passes;
    await eventually(() => (t.gw.controller.counters().nginx!.passes >= passes + 3 ? true : undefined));
    await t.gw.controller.whenIdle();
    const after = await stampTree(t.gw.paths.confDir);
    expect(after.get('sites/zz-foreign.conf')).toEqual(before.get('sites/zz-foreign.conf'));
    expect(after.get('zz-operator.conf')).toEqual(before.get('zz-operator.conf'));
    expect(await readFile(foreignSite, 'utf8')).toBe('# written by the operator\n');
    await rm(foreignSite);
    await rm(foreignTop);
  });
});

describe('isolation of a site that fails nginx -t', () => {
  let t: TestGateway;
  /** Domains whose rendered site gets a directive nginx -t refuses. */
  const broken = new Set(['broken.gw.test']);
  type Conditions = { type: string; status: string; reason: string; message: string }[];
  const nginxObjects = async (): Promise<Record<string, { conditions: Conditions }>> => {
    const status = (await api(t, { path: '/api/v1/status' })).json as {
      loops: Record<string, { objects: Record<string, { conditions: Conditions }> }>;
    };
    return status.loops.nginx!.objects;
  };
  beforeAll(async () => {
    t = await startTestGateway({
      deps: {
        renderHook: (name, text) => {
          const domain = /^sites\/(.*)\.conf$/.exec(name)?.[1];
          if (domain === undefined || !broken.has(domain)) return text;
          return text.replace(`server_name ${domain};`, `server_name ${domain};\n    bogus_directive on;`);
        },
      },
    });
  });
  afterAll(async () => {
    await t?.cleanup();
  });

  it("holds the broken site back, reports it Degraded with nginx's message, serves the rest", async () => {
    const r = await putState(
      t,
      gatewayDoc([
        { run: 'alpha', ports: [ports[0]] },
        { run: 'broken', ports: [ports[1]] },
        { run: 'gamma', ports: [ports[2]] },
      ]),
    );
    expect(r.status, r.body).toBe(200);
    expect(await whoAnswered(t, 'alpha.gw.test')).toBe('a0');
    expect(await whoAnswered(t, 'gamma.gw.test')).toBe('b0');
    // Its site is held back, but an open service needs nothing its site adds: the default server relays it by host.
    expect(await whoAnswered(t, 'broken.gw.test')).toBe('a1');
    await expect(readFile(siteFile(t, 'broken.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });

    const status = (await api(t, { path: '/api/v1/status' })).json as {
      loops: Record<
        string,
        { objects: Record<string, { conditions: { type: string; status: string; reason: string; message: string }[] }> }
      >;
    };
    const broken = status.loops.nginx!.objects['broken.gw.test']!.conditions;
    const degraded = broken.find((c) => c.type === 'Degraded');
    expect(degraded).toMatchObject({ status: 'True', reason: 'ConfigRejected' });
    expect(degraded!.message).toMatch(/unknown directive "bogus_directive"/);
    expect(broken.find((c) => c.type === 'Ready')).toMatchObject({ status: 'False' });
    expect(status.loops.nginx!.objects['alpha.gw.test']!.conditions.find((c) => c.type === 'Ready')).toMatchObject({ status: 'True' });
  });

  it('keeps nginx healthy: later changes converge, the live config passes nginx -t', async () => {
    const r = await putState(
      t,
      gatewayDoc([
        { run: 'alpha', ports: [ports[1]] },
        { run: 'broken', ports: [ports[1]] },
        { run: 'gamma', ports: [ports[2]] },
        { run: 'delta', ports: [ports[0]] },
      ]),
    );
    expect(r.json.changed).toBe(true);
    expect(await whoAnswered(t, 'alpha.gw.test')).toBe('a1');
    expect(await whoAnswered(t, 'delta.gw.test')).toBe('a0');
    expect(await whoAnswered(t, 'gamma.gw.test')).toBe('b0');
    expect(await whoAnswered(t, 'broken.gw.test')).toBe('a1');
    expect(t.gw.nginxStats.reloadFailures).toBe(0);
    const live = t.gw.nginx!;
    const res = await testConfig(join(t.gw.paths.stateDir, 'nginx', 'nginx.conf'), join(t.gw.paths.stateDir, 'nginx'));
    expect(res).toEqual({ ok: true });
    expect(live.pid).toBeDefined();
  });

  it('a rejected update keeps the previous version serving, reported ServingPrevious', async () => {
    broken.add('gamma.gw.test');
    const reloads = t.gw.nginxStats.reloads;
    const r = await putState(
      t,
      gatewayDoc([
        { run: 'alpha', ports: [ports[1]] },
        { run: 'broken', ports: [ports[1]] },
        { run: 'gamma', ports: [ports[0]] },
        { run: 'delta', ports: [ports[0]] },
      ]),
    );
    expect(r.json.changed).toBe(true);
    // The site's Nginx config is the previous one; its replicas are the balancer's, chosen per
    // request, so the new replica answers at once.
    expect(await whoAnswered(t, 'gamma.gw.test')).toBe('a0');
    expect(await readFile(siteFile(t, 'gamma.gw.test'), 'utf8')).not.toContain('bogus_directive');
    expect(t.gw.nginxStats.reloads).toBe(reloads);
    const gamma = (await nginxObjects())['gamma.gw.test']!.conditions;
    expect(gamma.find((c) => c.type === 'Ready')).toMatchObject({ status: 'True', reason: 'ServingPrevious' });
    expect(gamma.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'True', reason: 'ConfigRejected' });
    broken.delete('gamma.gw.test');
  });

  it('removing a rejected service clears its status', async () => {
    const r = await putState(
      t,
      gatewayDoc([
        { run: 'alpha', ports: [ports[1]] },
        { run: 'gamma', ports: [ports[0]] },
      ]),
    );
    expect(r.json.changed).toBe(true);
    expect(await whoAnswered(t, 'gamma.gw.test')).toBe('a0');
    expect((await viaNginx(t, 'delta.gw.test')).status).toBe(404);
    const objects = await nginxObjects();
    expect(Object.keys(objects).sort()).toEqual(['alpha.gw.test', 'gamma.gw.test', 'global']);
    expect(objects['gamma.gw.test']!.conditions.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'False' });
  });
});

describe('restart', () => {
  it('a restart on the same state dir rewrites nothing, reloads nothing, keeps the generation', async () => {
    const first = await startTestGateway();
    try {
      const r = await putState(
        first,
        gatewayDoc([
          { run: 'alpha', ports: [ports[0]] },
          { run: 'beta', auth: true, ports: [ports[2]] },
        ]),
      );
      expect(r.json.generation).toBe(1);
      await first.close();
      const before = await stampTree(first.gw.paths.confDir);
      const stateBefore = await stampTree(first.stateDir).then((m) => m.get('state.json'));

      const second = await startTestGateway({
        stateDir: first.stateDir,
        ports: { apiPort: first.apiPort, httpPort: first.httpPort, httpsPort: first.httpsPort },
      });
      try {
        expect(changedFiles(before, await stampTree(second.gw.paths.confDir))).toEqual([]);
        expect((await stampTree(second.stateDir)).get('state.json')).toEqual(stateBefore);
        expect(second.gw.nginxStats.reloads).toBe(0);
        expect(second.gw.nginxStats.filesWritten).toBe(0);
        const state = (await api(second, { path: '/api/v1/state' })).json as { metadata: { generation: number; hash: string } };
        expect(state.metadata.generation).toBe(1);
        expect(state.metadata.hash).toBe(r.json.hash);
        expect(await whoAnswered(second, 'alpha.gw.test')).toBe('a0');
        expect((await api(second, { path: '/readyz' })).status).toBe(200);
      } finally {
        await second.close();
      }
    } finally {
      await first.cleanup();
    }
  });

  it('a corrupt state.json stops the start with an error naming the file', async () => {
    const CORRUPT = '{"apiVersion": "proxy.dstack.ai/v1alpha1", "kind": ';
    const { dir, cleanup } = tmpDir('dp-e2e-corrupt-');
    try {
      await writeFile(join(dir, 'state.json'), CORRUPT);
      const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
      const options = resolveOptions({
        flags: {
          stateDir: dir,
          apiPort: String(apiPort),
          httpPort: String(httpPort),
          httpsPort: String(httpsPort),
          listenHost: '127.0.0.1',
          logLevel: 'silent',
        },
      });
      await expect(startGateway(options)).rejects.toThrow(join(dir, 'state.json'));
      // It failed before touching anything: no Nginx prefix was even created.
      await expect(stat(join(dir, 'nginx'))).rejects.toMatchObject({ code: 'ENOENT' });
      expect(await readFile(join(dir, 'state.json'), 'utf8')).toBe(CORRUPT);
    } finally {
      cleanup();
    }
  });
});
