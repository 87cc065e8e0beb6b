// Where the compatibility routes deliberately behave better than dstack's own gateway, end to
// end against real Nginx and sshd: an identical re-send of any registration answers 200 and
// writes nothing; a replica that cannot be reached is refused with dstack's text within the
// bounded wait and left out of the document; an unregistered replica gets no new request
// although Nginx held keep-alive connections to it; and an operator's own services (PUT
// /api/v1/state, no owner) live beside the server's: the server never lists them, so its sync
// never removes them, and the operator's read-modify-write keeps the server's services.

import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REDACTED } from '../../../src/spec/index.js';
import { api, putState, siteServed, type TestGateway } from '../../helpers/gateway.js';
import { eventually } from '../../helpers/nginx.js';
import { freePort } from '../../helpers/ports.js';
import { startSshd, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { call } from '../../e2e/integration-harness.js';
import {
  configPayload,
  dstackId,
  dstackProjectKey,
  openaiEntrypointDomain,
  openaiModel,
  registerServicePayload,
  vmReplicaPayload,
  type DstackKey,
  type RegisterReplicaPayload,
} from './fixtures.js';
import { DstackServer, generationOf, startCompatGateway, startCountingApp, type CountingApp, type ListedService } from './harness.js';

const PROJECT = 'main';
/** Seconds `replicas/register` waits for Ready before it gives up. */
const REPLICA_WAIT_S = 10;

let tmp: ReturnType<typeof tmpDir>;
let key: DstackKey;
let sshd: TestSshd;
let t: TestGateway;
let server: DstackServer;
const apps: CountingApp[] = [];

beforeAll(async () => {
  tmp = tmpDir('dp-dstack-sem-');
  key = dstackProjectKey();
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  t = await startCompatGateway({ flags: { dstackCompatReplicaWait: String(REPLICA_WAIT_S) } });
  server = new DstackServer(() => t);
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await sshd?.stop();
  for (const a of apps) await a.close();
  tmp?.cleanup();
});

const ok = { status: 'ok' };
const domainOf = (run: string): string => `${run}.dstack.test`;

async function app(name: string): Promise<CountingApp> {
  const a = await startCountingApp(name);
  apps.push(a);
  return a;
}

function replicaOn(a: CountingApp, jobId = dstackId()): RegisterReplicaPayload {
  return vmReplicaPayload({ jobId, appPort: a.port, user: sshd.user, host: '127.0.0.1', sshPort: sshd.port });
}

function get(run: string, path = '/'): ReturnType<typeof call> {
  return call({ port: t.httpPort, host: domainOf(run), path, localAddress: '127.0.0.2' });
}

/** Register a plain service (no model, no auth) and answer its payload. */
async function service(run: string) {
  const payload = registerServicePayload({ runName: run, domain: domainOf(run), auth: false, model: null, sshPrivateKey: key.privateKey });
  const r = await server.registerService(PROJECT, payload);
  expect([r.status, r.json]).toEqual([200, ok]);
  return payload;
}

function listedRun(list: ListedService[], run: string): ListedService | undefined {
  return list.find((s) => s.project_name === PROJECT && s.run_name === run);
}

describe('identical re-sends and unknown unregisters', () => {
  it('every register call sent twice: 200 both times, the second writes nothing', async () => {
    const a = await app('resend');
    const model = openaiModel({ name: 'acme/Resend-1B' });
    const svc = registerServicePayload({
      runName: 'resend',
      domain: domainOf('resend'),
      auth: false,
      model,
      sshPrivateKey: key.privateKey,
    });
    const replica = replicaOn(a);
    const calls: [string, () => ReturnType<DstackServer['call']>][] = [
      ['config', () => server.config(configPayload())],
      ['entrypoint', () => server.registerEntrypoint(PROJECT, { domain: openaiEntrypointDomain(domainOf('resend')), https: false })],
      ['service', () => server.registerService(PROJECT, svc)],
      ['replica', () => server.registerReplica(PROJECT, 'resend', replica)],
    ];
    for (const [name, send] of calls) {
      const first = await send();
      expect([name, first.status, first.json]).toEqual([name, 200, ok]);
      const generation = await generationOf(t);
      const again = await send();
      expect([name, again.status, again.json]).toEqual([name, 200, ok]);
      expect([name, await generationOf(t)]).toEqual([name, generation]);
    }
    expect(listedRun(await server.list(), 'resend')).toEqual({
      id: svc.id,
      project_name: PROJECT,
      run_name: 'resend',
      replicas: [{ id: replica.job_id }],
    });
    // The new site goes live with the next (paced) Nginx reload, which may come after the answers.
    await eventually(async () => ((await get('resend', '/x')).status === 200 ? true : undefined), 30_000);
  }, 120_000);

  it('unregister of a service or a replica the gateway does not know: 200, nothing written', async () => {
    const generation = await generationOf(t);
    const unknownService = await server.unregisterService(PROJECT, 'never-registered');
    expect([unknownService.status, unknownService.json]).toEqual([200, ok]);
    const unknownReplica = await server.unregisterReplica(PROJECT, 'resend', dstackId());
    expect([unknownReplica.status, unknownReplica.json]).toEqual([200, ok]);
    expect(await generationOf(t)).toBe(generation);
  });
});

describe('an unreachable replica', () => {
  it("400 with dstack's text within the bounded wait, absent from list and from the document", async () => {
    await service('unreachable');
    const closed = await freePort();
    const jobId = dstackId();
    const r = await server.registerReplica(
      PROJECT,
      'unreachable',
      vmReplicaPayload({ jobId, appPort: 8000, user: sshd.user, host: '127.0.0.1', sshPort: closed }),
    );
    expect(r.status).toBe(400);
    expect((r.json as { detail: string }).detail).toMatch(
      new RegExp(`^Cannot register replica ${jobId} in service ${PROJECT}/unreachable: \\S`),
    );
    // Bounded by the wait (plus slack for a loaded machine), never by ssh's own timeouts.
    expect(r.ms).toBeLessThan((REPLICA_WAIT_S + 20) * 1000);
    expect(listedRun(await server.list(), 'unreachable')?.replicas).toEqual([]);
    const doc = (await api(t, { path: '/api/v1/state' })).json as { spec: { services: { run: string; replicas: { id: string }[] }[] } };
    expect(doc.spec.services.find((s) => s.run === 'unreachable')?.replicas).toEqual([]);
  }, 120_000);
});

describe('an unregistered replica', () => {
  it('gets no new request once replicas/unregister answered, while a second replica keeps serving', async () => {
    await service('pair');
    const [first, second] = [await app('pair-1'), await app('pair-2')];
    const [job1, job2] = [dstackId(), dstackId()];
    for (const [a, job] of [
      [first, job1],
      [second, job2],
    ] as const) {
      const r = await server.registerReplica(PROJECT, 'pair', replicaOn(a, job));
      expect([r.status, r.json]).toEqual([200, ok]);
    }
    // registerService answers before Nginx serves the new site: until the reload is through,
    // workers of the previous config still take some connections (and answer 404).
    await siteServed(t, domainOf('pair'));
    // Concurrent requests until both replicas answered: Nginx and the balancer now hold
    // keep-alive connections to each.
    await eventually(async () => {
      const replies = await Promise.all(Array.from({ length: 8 }, (_, i) => get('pair', `/warm/${i}`)));
      for (const x of replies) if (x.status !== 200) throw new Error(`answered ${x.status}: ${x.body}`);
      return first.seen.length > 0 && second.seen.length > 0 ? true : undefined;
    }, 60_000);

    const r = await server.unregisterReplica(PROJECT, 'pair', job1);
    expect([r.status, r.json]).toEqual([200, ok]);
    const firstSeen = first.seen.length;
    const secondSeen = second.seen.length;
    for (let i = 0; i < 5; i++) {
      const replies = await Promise.all(Array.from({ length: 8 }, (_, j) => get('pair', `/after/${i}/${j}`)));
      const refused = replies.filter((x) => x.status !== 200).map((x) => `${x.status} ${x.body.slice(0, 300)}`);
      expect(
        replies.map((x) => x.status),
        refused.join('\n'),
      ).toEqual(Array(8).fill(200));
    }
    expect(first.seen.length).toBe(firstSeen);
    expect(second.seen.length).toBe(secondSeen + 40);
    expect(listedRun(await server.list(), 'pair')?.replicas).toEqual([{ id: job2 }]);
  }, 120_000);
});

describe("an operator's services beside the server's", () => {
  interface Doc {
    apiVersion: string;
    kind: string;
    metadata: { generation: number };
    spec: {
      projects: { name: string; sshPrivateKey?: string }[];
      services: { project: string; run: string; owner?: string; replicas: unknown[] }[];
    } & Record<string, unknown>;
  }

  /** The operator's read-modify-write: GET the document, put its own secrets back, change, PUT with If-Match. */
  async function operatorPut(change: (d: Doc) => void) {
    const d = (await api(t, { path: '/api/v1/state' })).json as Doc;
    for (const p of d.spec.projects) if (p.sshPrivateKey === REDACTED) p.sshPrivateKey = key.privateKey;
    change(d);
    const { metadata, ...doc } = d;
    const r = await putState(t, doc, { ifMatch: String(metadata.generation) });
    expect(r.status).toBe(200);
    return r;
  }

  it("neither removes the other's services; the operator's service is never listed", async () => {
    const mine = await app('operator');
    const mine2 = await app('operator-2');
    const operatorService = (ports: number[]) => ({
      project: PROJECT,
      run: 'operator-svc',
      domain: domainOf('operator-svc'),
      https: false,
      auth: false,
      replicas: ports.map((port, i) => ({ id: `operator-r${i}`, appPort: port, direct: { host: '127.0.0.1', port } })),
    });
    await service('kept');
    const keptReplica = await server.registerReplica(PROJECT, 'kept', replicaOn(await app('kept')));
    expect(keptReplica.status).toBe(200);
    const serverServices = (await server.list()).map((s) => s.run_name);

    await operatorPut((d) => d.spec.services.push(operatorService([mine.port])));
    await eventually(async () => ((await get('operator-svc')).status === 200 ? true : undefined), 30_000);
    // The operator's PUT kept every service of the server, and the server does not see the operator's.
    const listed = await server.list();
    expect(listed.map((s) => s.run_name)).toEqual(serverServices);
    expect(listedRun(listed, 'operator-svc')).toBeUndefined();
    const doc = (await api(t, { path: '/api/v1/state' })).json as Doc;
    expect(doc.spec.services.find((s) => s.run === 'operator-svc')?.owner).toBeUndefined();
    expect(doc.spec.services.find((s) => s.run === 'kept')?.owner).toBe('dstack-server');

    // The server's calls: a new service, then its sync drops every listed service it no longer expects.
    await service('fresh');
    const dropped = await server.syncUnregister(PROJECT, { fresh: [] });
    expect(dropped.length).toBe(serverServices.length);
    for (const r of dropped) expect([r.status, r.json]).toEqual([200, ok]);
    expect((await server.list()).map((s) => s.run_name)).toEqual(['fresh']);
    const after = (await api(t, { path: '/api/v1/state' })).json as Doc;
    expect(after.spec.services.map((s) => s.run).sort()).toEqual(['fresh', 'operator-svc']);
    expect((await get('operator-svc')).status).toBe(200);
    await eventually(async () => ((await get('kept')).status === 404 ? true : undefined), 30_000);

    // Even named directly, the server cannot take the operator's service over or remove it.
    const takeover = await server.registerService(
      PROJECT,
      registerServicePayload({
        runName: 'operator-svc',
        domain: domainOf('other'),
        auth: false,
        model: null,
        sshPrivateKey: key.privateKey,
      }),
    );
    expect([takeover.status, takeover.json]).toEqual([400, { detail: `Service ${PROJECT}/operator-svc is already registered` }]);
    const generation = await generationOf(t);
    const removal = await server.unregisterService(PROJECT, 'operator-svc');
    expect([removal.status, removal.json]).toEqual([200, ok]);
    expect(await generationOf(t)).toBe(generation);
    expect((await get('operator-svc')).status).toBe(200);

    // The operator changes its service again: the server's new service stays.
    await operatorPut((d) => {
      const i = d.spec.services.findIndex((s) => s.run === 'operator-svc');
      d.spec.services[i] = operatorService([mine.port, mine2.port]);
    });
    expect((await server.list()).map((s) => s.run_name)).toEqual(['fresh']);
    await eventually(async () => {
      const replies = await Promise.all(Array.from({ length: 8 }, () => get('operator-svc')));
      return mine2.seen.length > 0 && replies.every((r) => r.status === 200) ? true : undefined;
    }, 30_000);
  }, 120_000);
});
