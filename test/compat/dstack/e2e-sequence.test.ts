// An unmodified dstack server's whole conversation with our gateway, end to end: the calls its
// sync sends, one at a time and in its order (config → the OpenAI entrypoint → the service with
// a model, rate limits and auth → three SSH replicas: on a VM, dockerized behind the VM, and
// behind an SSH fleet's head node with its own key), then real traffic through Nginx under the
// service's domain (HTTPS from Pebble) and through the entrypoint's model API with the `openai`
// SDK, the stats the autoscaler reads in dstack's exact shape, and the unregisters. The project
// key is made as the server makes it (RSA-2048 PKCS#8) and only that key opens the replicas'
// sshds, so traffic proves the key works end to end. The second run restarts the gateway once
// the replicas are registered: the document, `list` and the Nginx configuration survive it
// without a reload, the tunnels come back, and the server's remaining calls succeed.

import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GatewayDeps } from '../../../src/daemon/gateway.js';
import { api, type TestGateway } from '../../helpers/gateway.js';
import { eventually } from '../../helpers/nginx.js';
import { startPebble, type TestPebble } from '../../helpers/pebble.js';
import { generateKey, startSshd, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { call, startControlServer, type ControlServer, type Reply } from '../../e2e/integration-harness.js';
import {
  dockerReplicaPayload,
  dstackId,
  dstackProjectKey,
  headerRateLimit,
  headProxyReplicaPayload,
  ipRateLimit,
  openaiEntrypointDomain,
  openaiModel,
  pebbleConfigPayload,
  registerServicePayload,
  vmReplicaPayload,
  type DstackKey,
} from './fixtures.js';
import {
  DstackServer,
  generationOf,
  loopbackFetch,
  startCompatGateway,
  startCountingApp,
  type CountingApp,
  type ListedService,
  type StatsRow,
} from './harness.js';

const PROJECT = 'main';
const RUN = 'llm';
const DOMAIN = 'llm.dstack.test';
const ENTRYPOINT = openaiEntrypointDomain(DOMAIN);
const MODEL = 'acme/Llama-Test-8B';
const MEMBER = 'dstack-user-token-0123456789';

let tmp: ReturnType<typeof tmpDir>;
let pebble: TestPebble;
let root: string;
let control: ControlServer;
let projectKey: DstackKey;
let headKey: ClientKey;
/** A VM's sshd, the container's runner sshd behind it, and an SSH fleet's head node. */
let vm: TestSshd;
let container: TestSshd;
let head: TestSshd;
let loop: ReturnType<typeof loopbackFetch>;

beforeAll(async () => {
  tmp = tmpDir('dp-dstack-seq-');
  pebble = await startPebble();
  root = await pebble.rootPem();
  control = await startControlServer({ [PROJECT]: [MEMBER] });
  projectKey = dstackProjectKey();
  headKey = generateKey(join(tmp.dir, 'head_ed25519'));
  vm = await startSshd({ dir: join(tmp.dir, 'vm'), authorizedKeys: [projectKey.publicKey] });
  container = await startSshd({ dir: join(tmp.dir, 'container'), authorizedKeys: [projectKey.publicKey] });
  head = await startSshd({ dir: join(tmp.dir, 'head'), authorizedKeys: [headKey.publicKey] });
  loop = loopbackFetch();
}, 60_000);

afterAll(async () => {
  await vm?.stop();
  await container?.stop();
  await head?.stop();
  await control?.close();
  await pebble?.destroy();
  await loop?.close();
  tmp?.cleanup();
});

// The service's domains are not in DNS: the certificate pre-flight resolves everything to loopback.
const deps: GatewayDeps = { resolve: async () => ['127.0.0.1'] };
const flags = (): Record<string, string> => ({ serverUrl: control.url, acmeCaBundle: pebble.caPath, certbotTimeout: '60' });

/**
 * Requests to the service's domain that Nginx passed on towards a replica (not refused by auth
 * or a rate limit): what the stats count, whether a replica or the balancer (no Ready replica
 * yet) answered them.
 */
const passedOn = { count: 0 };

/** A request to the service's domain over HTTPS (Pebble's certificate verified), from 127.0.0.2. */
async function viaNginx(t: TestGateway, path: string, headers: Record<string, string> = {}): Promise<Reply> {
  const r = await call({ port: t.httpsPort, host: DOMAIN, path, ca: root, localAddress: '127.0.0.2', headers });
  if (![401, 403, 429].includes(r.status)) passedOn.count++;
  return r;
}

const withToken = { authorization: `Bearer ${MEMBER}` };

/** Batches of concurrent authenticated requests until `app` has answered one more; every answer must be 200. */
async function reaches(t: TestGateway, app: CountingApp): Promise<void> {
  const before = app.seen.length;
  await eventually(async () => {
    const replies = await Promise.all(Array.from({ length: 6 }, (_, i) => viaNginx(t, `/probe/${i}`, withToken)));
    for (const r of replies) if (r.status !== 200) throw new Error(`answered ${r.status}: ${r.body}`);
    return app.seen.length > before ? true : undefined;
  }, 60_000);
}

const ok = { status: 'ok' };

interface Run {
  restart: boolean;
}

async function sequence({ restart }: Run): Promise<void> {
  const apps = {
    vm: await startCountingApp('app-vm'),
    docker: await startCountingApp('app-docker'),
    head: await startCountingApp('app-head'),
  };
  const all = Object.values(apps);
  const first = await startCompatGateway({ flags: flags(), deps });
  let t = first;
  passedOn.count = 0;
  const server = new DstackServer(() => t);
  try {
    const runId = dstackId();
    const jobs = { vm: dstackId(), docker: dstackId(), head: dstackId() };
    const listed = (replicas: string[]): ListedService[] => [
      { id: runId, project_name: PROJECT, run_name: RUN, replicas: [...replicas].sort().map((id) => ({ id })) },
    ];

    // The key as the server makes it; only this key opens the VM's and the container's sshd.
    expect(projectKey.privateKey.startsWith('-----BEGIN PRIVATE KEY-----')).toBe(true);

    // The gateway replica comes up: the server submits its ACME settings first.
    const config = await server.config(pebbleConfigPayload(pebble.directoryUrl));
    expect([config.status, config.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual([]);

    // A service with a model: the entrypoint first, then the service.
    const entrypoint = await server.registerEntrypoint(PROJECT, { domain: ENTRYPOINT, https: false });
    expect([entrypoint.status, entrypoint.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual([]);

    const service = await server.registerService(
      PROJECT,
      registerServicePayload({
        id: runId,
        runName: RUN,
        domain: DOMAIN,
        https: true,
        auth: true,
        model: openaiModel({ name: MODEL }),
        rateLimits: [
          ipRateLimit({ prefix: '/', rps: 1000, burst: 1000 }),
          headerRateLimit('X-User', { prefix: '/limited', rps: 0.05, burst: 0 }),
        ],
        sshPrivateKey: projectKey.privateKey,
      }),
    );
    expect([service.status, service.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual(listed([]));

    // Replicas as the server registers them once their probes pass; each 200 means it serves.
    const onVm = await server.registerReplica(
      PROJECT,
      RUN,
      vmReplicaPayload({ jobId: jobs.vm, appPort: apps.vm.port, user: vm.user, host: '127.0.0.1', sshPort: vm.port }),
    );
    expect([onVm.status, onVm.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual(listed([jobs.vm]));
    await reaches(t, apps.vm);

    const dockerized = await server.registerReplica(
      PROJECT,
      RUN,
      dockerReplicaPayload({
        jobId: jobs.docker,
        appPort: apps.docker.port,
        containerUser: container.user,
        containerHost: 'localhost',
        containerSshPort: container.port,
        vm: { hostname: '127.0.0.1', username: vm.user, port: vm.port },
      }),
    );
    expect([dockerized.status, dockerized.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual(listed([jobs.vm, jobs.docker]));
    await reaches(t, apps.docker);
    expect(container.accepted()).toBeGreaterThanOrEqual(1);

    const headed = await server.registerReplica(
      PROJECT,
      RUN,
      headProxyReplicaPayload({
        jobId: jobs.head,
        appPort: apps.head.port,
        user: vm.user,
        host: '127.0.0.1',
        sshPort: vm.port,
        head: { hostname: '127.0.0.1', username: head.user, port: head.port },
        headKey: headKey.privateKey,
      }),
    );
    expect([headed.status, headed.json]).toEqual([200, ok]);
    const three = listed([jobs.vm, jobs.docker, jobs.head]);
    expect(await server.list()).toEqual(three);
    await reaches(t, apps.head);
    expect(head.accepted()).toBeGreaterThanOrEqual(1);

    if (restart) {
      const generation = await generationOf(t);
      const reuse = { stateDir: t.stateDir, apiPort: t.apiPort, httpPort: t.httpPort, httpsPort: t.httpsPort };
      await t.close();
      t = await startCompatGateway({ reuse, flags: flags(), deps });
      // Its stats collector reads the access log from its own start on.
      passedOn.count = 0;
      // The stored document is served as it was: no write, no site rewritten, no Nginx reload, the same list.
      expect(t.gw.nginxStats.reloads).toBe(0);
      expect(t.gw.nginxStats.filesWritten).toBe(0);
      expect(await generationOf(t)).toBe(generation);
      expect(await server.list()).toEqual(three);
      // The tunnels come back on their own: every replica serves again.
      for (const app of all) await reaches(t, app);
      expect(t.gw.nginxStats.reloads).toBe(0);
    }
    // Traffic under the service's domain: a member's token passes.
    const served = await viaNginx(t, '/hello', withToken);
    expect(served.status).toBe(200);
    const echoed = JSON.parse(served.body) as { name: string; url: string; headers: Record<string, string> };
    expect(all.map((a) => a.name)).toContain(echoed.name);
    expect(echoed.url).toBe('/hello');
    expect(echoed.headers.host).toBe(DOMAIN);
    // The token is the gateway's business: the replica does not see it.
    expect(echoed.headers.authorization).toBeUndefined();

    // Without a token 401 (dstack's gateway: 403), with one that is not a member's 403; neither reaches a replica.
    const seenBefore = all.reduce((n, a) => n + a.seen.length, 0);
    expect((await viaNginx(t, '/hello')).status).toBe(401);
    expect((await viaNginx(t, '/hello', { authorization: 'Bearer not-a-member-token-0123' })).status).toBe(403);
    expect(all.reduce((n, a) => n + a.seen.length, 0)).toBe(seenBefore);
    // Nginx's auth target says why in dstack's words.
    const denied = await api(t, { path: `/api/auth/${PROJECT}`, token: 'not-a-member-token-0123' });
    expect([denied.status, denied.json]).toEqual([403, { detail: `Unauthenticated or unauthorized to access project ${PROJECT}` }]);

    // The header-keyed limit (3 requests a minute, no burst) refuses a quick second request.
    const limited: number[] = [];
    for (let i = 0; i < 3; i++) limited.push((await viaNginx(t, '/limited', { ...withToken, 'x-user': 'alice' })).status);
    expect(limited[0]).toBe(200);
    expect(limited).toContain(429);

    // The model API on the entrypoint's domain, with the official SDK.
    const sdk = new OpenAI({ apiKey: MEMBER, baseURL: `http://${ENTRYPOINT}:${t.httpPort}/`, maxRetries: 0, fetch: loop.fetch });
    const models = await sdk.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    const completion = await sdk.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }] });
    expect(completion.choices[0]?.message.content).toMatch(/^Hello from app-(vm|docker|head)$/);
    const chat = all.flatMap((a) => a.seen).find((s) => s.url === '/v1/chat/completions');
    expect(chat?.headers.host).toBe(DOMAIN);
    expect((JSON.parse(chat!.body) as { model: string }).model).toBe(MODEL);
    await expect(sdk.withOptions({ apiKey: 'not-a-member-token-0123' }).models.list()).rejects.toMatchObject({ status: 403 });

    // The stats the autoscaler reads: dstack's shape, every window present, the traffic counted.
    // Plus the chat completion: the model API sends it through Nginx under the service's domain.
    const expected = passedOn.count + 1;
    const rows = await eventually(async () => {
      const s = await server.stats();
      const got = s.find((r) => r.project_name === PROJECT && r.run_name === RUN)?.stats['300']?.requests;
      if (got !== expected) throw new Error(`${expected} requests passed on towards the replicas, stats count ${got}`);
      return s;
    }, 30_000);
    expectDstackStatsShape(rows);
    const row = rows.find((r) => r.project_name === PROJECT && r.run_name === RUN)!;
    expect(row.stats['30']!.requests).toBeLessThanOrEqual(row.stats['60']!.requests);
    expect(row.stats['60']!.requests).toBeLessThanOrEqual(row.stats['300']!.requests);
    expect(row.stats['300']!.request_time).toBeGreaterThanOrEqual(0);

    // The VM replica goes away: it gets no new request, the other two keep serving.
    const gone = await server.unregisterReplica(PROJECT, RUN, jobs.vm);
    expect([gone.status, gone.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual(listed([jobs.docker, jobs.head]));
    const vmSeen = apps.vm.seen.length;
    for (let i = 0; i < 4; i++) {
      const replies = await Promise.all(Array.from({ length: 6 }, (_, j) => viaNginx(t, `/after/${i}/${j}`, withToken)));
      expect(replies.map((r) => r.status)).toEqual(Array(6).fill(200));
    }
    expect(apps.vm.seen.length).toBe(vmSeen);

    // Then the service: gone from the list, its site and its model with it.
    const unregistered = await server.unregisterService(PROJECT, RUN);
    expect([unregistered.status, unregistered.json]).toEqual([200, ok]);
    expect(await server.list()).toEqual([]);
    await eventually(
      async () => ((await call({ port: t.httpPort, host: DOMAIN, path: '/hello' })).status === 404 ? true : undefined),
      30_000,
    );
    await eventually(async () => ((await sdk.models.list()).data.length === 0 ? true : undefined), 30_000);
    if (restart) expect(t.gw.nginxStats.reloadFailures).toBe(0);
  } finally {
    await t.close();
    // The first process made the state dir: its cleanup removes it.
    await first.cleanup();
    for (const a of all) await a.close();
  }
}

/** Exactly dstack's `/api/stats/collect`: a list of {project_name, run_name, stats} with windows "30", "60", "300". */
function expectDstackStatsShape(rows: StatsRow[]): void {
  expect(Array.isArray(rows)).toBe(true);
  for (const r of rows) {
    expect(Object.keys(r).sort()).toEqual(['project_name', 'run_name', 'stats']);
    expect(Object.keys(r.stats).sort()).toEqual(['30', '300', '60']);
    for (const w of Object.values(r.stats)) {
      expect(Object.keys(w).sort()).toEqual(['request_time', 'requests']);
      expect(Number.isInteger(w.requests)).toBe(true);
      expect(typeof w.request_time).toBe('number');
      expect(w.request_time).toBeGreaterThanOrEqual(0);
    }
  }
}

describe("a dstack server's sequence against the compatibility routes", () => {
  it('config → entrypoint → service → three SSH replicas → traffic → stats → unregisters', () => sequence({ restart: false }), 300_000);

  it('the same with a gateway restart once the replicas are registered', () => sequence({ restart: true }), 300_000);
});
