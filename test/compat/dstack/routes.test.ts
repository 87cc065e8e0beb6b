// dstack's gateway API against a real gateway (private Nginx, a loopback sshd and an HTTP app
// behind it), with the payloads an unmodified server sends: every route's happy path, identical
// re-sends (200, no new generation), unknown ids, dstack's refusal texts, FastAPI's 422 and 404
// shapes, `services/list` after each step, an operator's service left alone, and the routes
// absent unless asked for and refused beyond loopback.

import { systemClock } from '../../../src/clock.js';
import type { Server } from 'node:http';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Fastify from 'fastify';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dstackRoutes } from '../../../src/compat/dstack/routes.js';
import {
  domainTaken,
  replicaAlreadyExists,
  serviceAlreadyHasId,
  serviceAlreadyRegistered,
  serviceMissingCannotRegisterReplica,
  serviceMissingCannotSetId,
} from '../../../src/compat/dstack/texts.js';
import { api, type TestGateway } from '../../helpers/gateway.js';
import { close, startEcho } from '../../helpers/http.js';
import { eventually } from '../../helpers/nginx.js';
import { freePort } from '../../helpers/ports.js';
import { startSshd, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { call, startControlServer, startGatewayWith, type ControlServer } from '../../e2e/integration-harness.js';
import { dstack, generation, listed, startCompatGateway } from './harness.js';
import {
  configPayload,
  dstackId,
  dstackPaths,
  dstackProjectKey,
  entrypointPayload,
  registerServicePayload,
  setIdPayload,
  vmReplicaPayload,
  type DstackKey,
} from './fixtures.js';

const TOKEN = 'operator-token-0123456789';

let tmp: ReturnType<typeof tmpDir>;
let key: DstackKey;
let sshd: TestSshd;
let app: Server;
let appPort: number;
let t: TestGateway;
let control: ControlServer;

beforeAll(async () => {
  tmp = tmpDir('dp-compat-routes-');
  key = dstackProjectKey();
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  appPort = await freePort();
  app = await startEcho('dstack-app', { port: appPort });
  const tokenFile = join(tmp.dir, 'token');
  writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  // An API token for the management routes: dstack's routes and the stats still take none.
  control = await startControlServer({ main: ['member-token'] });
  t = await startCompatGateway({ flags: { apiTokenFile: tokenFile, serverUrl: control.url } });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  await control?.close();
  await sshd?.stop();
  if (app) await close(app);
  tmp?.cleanup();
});

const replicaPayload = (jobId = dstackId()) => vmReplicaPayload({ jobId, appPort, user: sshd.user, host: '127.0.0.1', sshPort: sshd.port });

async function storedService(project: string, run: string) {
  return (await t.gw.store.read()).state.spec.services.find((s) => s.project === project && s.run === run);
}

describe('GET / and POST /api/config', () => {
  it('GET / names our version and implementation', async () => {
    const r = await dstack(t, '/', undefined, 'GET');
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ version: expect.stringMatching(/^\d+\.\d+\.\d+/), implementation: 'dstack-proxy' });
  });

  it('config: 200, and an identical re-send stores nothing', async () => {
    const r = await dstack(t, dstackPaths.config, configPayload({ acme_server: 'https://acme.example.test/directory' }));
    expect(r).toMatchObject({ status: 200, json: { status: 'ok' } });
    const g = await generation(t);
    expect((await t.gw.store.read()).state.spec.acme.server).toBe('https://acme.example.test/directory');
    const again = await dstack(t, dstackPaths.config, configPayload({ acme_server: 'https://acme.example.test/directory' }));
    expect(again.status).toBe(200);
    expect(await generation(t)).toBe(g);
  });

  it('the EAB key never comes back in an answer', async () => {
    const r = await dstack(
      t,
      dstackPaths.config,
      configPayload({
        acme_server: 'https://acme.example.test/directory',
        acme_eab_kid: 'kid-1',
        acme_eab_hmac_key: 'c2VjcmV0LWhtYWMta2V5LXZhbHVl',
      }),
    );
    expect(r.status).toBe(200);
    expect(r.body).not.toContain('c2VjcmV0LWhtYWMta2V5LXZhbHVl');
  });
});

describe('services, replicas, entrypoints, list', () => {
  const run = 'llama-svc';
  const id = dstackId();
  const jobId = dstackId();

  it('list starts empty', async () => {
    expect(await listed(t)).toEqual([]);
  });

  it('services/register: 200, stored with the owner, listed', async () => {
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ id, runName: run, auth: false, sshPrivateKey: key.privateKey }),
    );
    expect(r).toMatchObject({ status: 200, json: { status: 'ok' } });
    expect(await listed(t)).toEqual([{ id, project_name: 'main', run_name: run, replicas: [] }]);
    expect((await storedService('main', run))?.owner).toBe('dstack-server');
  });

  it('an identical services/register: 200 and no new generation', async () => {
    const g = await generation(t);
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ id, runName: run, auth: false, sshPrivateKey: key.privateKey }),
    );
    expect(r.status).toBe(200);
    expect(await generation(t)).toBe(g);
  });

  it('the same name with another id: 400 already registered', async () => {
    const r = await dstack(t, dstackPaths.registerService('main'), registerServicePayload({ runName: run, sshPrivateKey: key.privateKey }));
    expect(r).toEqual({ status: 400, json: { detail: serviceAlreadyRegistered('main', run) }, body: expect.any(String) });
  });

  it("another service on a taken domain: 400 with dstack's text", async () => {
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ runName: 'other', domain: `${run}.main.example.test`, sshPrivateKey: key.privateKey }),
    );
    expect(r.status).toBe(400);
    expect(r.json).toEqual({ detail: domainTaken(`${run}.main.example.test`) });
    expect((await listed(t)).map((s) => s.run_name)).toEqual([run]);
  });

  it('a value the document refuses: 400 "<path>: <message>", nothing stored', async () => {
    const g = await generation(t);
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ runName: 'bad-domain', domain: 'not a domain', sshPrivateKey: key.privateKey }),
    );
    expect(r.status).toBe(400);
    expect((r.json as { detail: string }).detail).toMatch(/^\/spec\/\S+: \S/);
    expect(await generation(t)).toBe(g);
  });

  it('replicas/register for an unknown service: 400', async () => {
    const r = await dstack(t, dstackPaths.registerReplica('main', 'nope'), replicaPayload());
    expect(r.status).toBe(400);
    expect(r.json).toEqual({ detail: serviceMissingCannotRegisterReplica('main', 'nope') });
  });

  it('replicas/register: 200 once the tunnel is up; traffic flows through Nginx', async () => {
    const r = await dstack(t, dstackPaths.registerReplica('main', run), replicaPayload(jobId));
    expect(r).toMatchObject({ status: 200, json: { status: 'ok' } });
    expect(await listed(t)).toEqual([{ id, project_name: 'main', run_name: run, replicas: [{ id: jobId }] }]);
    const status = t.gw.controller.statuses().loops.ssh?.objects[`main/${run}/${jobId}`];
    expect(status?.conditions.find((c) => c.type === 'Ready')?.status).toBe('True');
    // 200 means traffic can flow: Nginx → balancer → tunnel → sshd → the app.
    const reply = await eventually(async () => {
      const x = await call({ port: t.httpPort, host: `${run}.main.example.test`, path: '/hello' }).catch(() => undefined);
      return x?.status === 200 ? x : undefined;
    }, 20_000);
    expect((JSON.parse(reply.body) as { name: string }).name).toBe('dstack-app');
  });

  it('an identical replicas/register: 200, no new generation', async () => {
    const g = await generation(t);
    const r = await dstack(t, dstackPaths.registerReplica('main', run), replicaPayload(jobId));
    expect(r.status).toBe(200);
    expect(await generation(t)).toBe(g);
  });

  it('the same replica id with another payload: 400 already exists', async () => {
    const other = { ...replicaPayload(jobId), app_port: appPort + 1 };
    const r = await dstack(t, dstackPaths.registerReplica('main', run), other);
    expect(r.status).toBe(400);
    expect(r.json).toEqual({ detail: replicaAlreadyExists(jobId, 'main', run) });
  });

  it('set_id: unknown service, and a service that has one, are refused', async () => {
    const a = await dstack(t, dstackPaths.setServiceId('main', 'nope'), setIdPayload());
    expect(a).toMatchObject({ status: 400, json: { detail: serviceMissingCannotSetId('main', 'nope') } });
    const b = await dstack(t, dstackPaths.setServiceId('main', run), setIdPayload());
    expect(b).toMatchObject({ status: 400, json: { detail: serviceAlreadyHasId('main', run) } });
  });

  it('set_id fills in the id of a service registered without one', async () => {
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ id: null, runName: 'legacy', sshPrivateKey: key.privateKey, model: null }),
    );
    expect(r.status).toBe(200);
    expect((await listed(t)).find((s) => s.run_name === 'legacy')?.id).toBeNull();
    const newId = dstackId();
    expect((await dstack(t, dstackPaths.setServiceId('main', 'legacy'), setIdPayload(newId))).status).toBe(200);
    expect((await listed(t)).find((s) => s.run_name === 'legacy')?.id).toBe(newId);
    expect((await dstack(t, dstackPaths.unregisterService('main', 'legacy'))).status).toBe(200);
  });

  it('entrypoints/register: 200, and a re-send changes nothing', async () => {
    const r = await dstack(t, dstackPaths.registerEntrypoint('main'), entrypointPayload());
    expect(r).toMatchObject({ status: 200, json: { status: 'ok' } });
    const g = await generation(t);
    expect((await t.gw.store.read()).state.spec.entrypoints).toEqual([
      { project: 'main', domain: 'gateway.main.example.test', https: false },
    ]);
    expect((await dstack(t, dstackPaths.registerEntrypoint('main'), entrypointPayload())).status).toBe(200);
    expect(await generation(t)).toBe(g);
  });

  it('unregistering an unknown replica or service: 200, nothing stored', async () => {
    const g = await generation(t);
    expect((await dstack(t, dstackPaths.unregisterReplica('main', run, dstackId()))).status).toBe(200);
    expect((await dstack(t, dstackPaths.unregisterReplica('main', 'nope', dstackId()))).status).toBe(200);
    expect((await dstack(t, dstackPaths.unregisterService('main', 'nope'))).status).toBe(200);
    expect(await generation(t)).toBe(g);
  });

  it('replicas/unregister, then services/unregister: gone from list and document', async () => {
    const r = await dstack(t, dstackPaths.unregisterReplica('main', run, jobId));
    expect(r).toMatchObject({ status: 200, json: { status: 'ok' } });
    expect(await listed(t)).toEqual([{ id, project_name: 'main', run_name: run, replicas: [] }]);
    const s = await dstack(t, dstackPaths.unregisterService('main', run));
    expect(s).toMatchObject({ status: 200, json: { status: 'ok' } });
    expect(await listed(t)).toEqual([]);
    expect(await storedService('main', run)).toBeUndefined();
  });

  it('project and run names are lower-cased as dstack routes them', async () => {
    const r = await dstack(
      t,
      dstackPaths.registerService('Main'),
      registerServicePayload({ runName: 'Upper', project: 'main', sshPrivateKey: key.privateKey, model: null }),
    );
    expect(r.status).toBe(200);
    expect((await listed(t)).map((s) => [s.project_name, s.run_name])).toEqual([['main', 'upper']]);
    expect((await dstack(t, dstackPaths.unregisterService('MAIN', 'UPPER'))).status).toBe(200);
    expect(await listed(t)).toEqual([]);
  });
});

describe("an operator's service", () => {
  it('is neither listed nor removed by the compat routes', async () => {
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ runName: 'managed', sshPrivateKey: key.privateKey, model: null }),
    );
    expect(r.status).toBe(200);
    const stored = await t.gw.store.read();
    const operatorService = { project: 'main', run: 'ops', domain: 'ops.main.example.test', https: false, auth: false, replicas: [] };
    const doc = {
      apiVersion: stored.state.apiVersion,
      kind: stored.state.kind,
      spec: { ...stored.state.spec, services: [...stored.state.spec.services, operatorService] },
    };
    const put = await api(t, {
      method: 'PUT',
      path: '/api/v1/state',
      body: doc,
      token: TOKEN,
      headers: { 'if-match': String(stored.generation) },
    });
    expect(put.status).toBe(200);
    expect((await listed(t)).map((s) => s.run_name)).toEqual(['managed']);
    expect((await dstack(t, dstackPaths.unregisterService('main', 'ops'))).status).toBe(200);
    expect((await storedService('main', 'ops'))?.owner).toBeUndefined();
    expect(await storedService('main', 'ops')).toBeDefined();
    // The server's own calls go on around it.
    expect((await dstack(t, dstackPaths.unregisterService('main', 'managed'))).status).toBe(200);
    expect(await storedService('main', 'ops')).toBeDefined();
    expect(await listed(t)).toEqual([]);
  });
});

describe('shapes', () => {
  it('malformed JSON: 422 json_invalid, as FastAPI answers', async () => {
    const r = await api(t, { method: 'POST', path: dstackPaths.registerService('main'), body: '{"run_name": ' });
    expect(r.status).toBe(422);
    expect((r.json as { detail: { type: string; loc: unknown[] }[] }).detail[0]).toMatchObject({
      type: 'json_invalid',
      loc: ['body', expect.any(Number)],
    });
  });

  it('a missing required field: 422 with a detail list naming it', async () => {
    const { ssh_private_key: _key, ...body } = registerServicePayload({ sshPrivateKey: key.privateKey });
    const r = await dstack(t, dstackPaths.registerService('main'), body);
    expect(r.status).toBe(422);
    const detail = (r.json as { detail: { loc: unknown[]; msg: string; type: string }[] }).detail;
    expect(Array.isArray(detail)).toBe(true);
    expect(detail.some((d) => d.loc.includes('ssh_private_key'))).toBe(true);
  });

  it('no body where one is required: 422', async () => {
    const r = await dstack(t, dstackPaths.registerReplica('main', 'x'));
    expect(r.status).toBe(422);
    expect(Array.isArray((r.json as { detail: unknown }).detail)).toBe(true);
  });

  it("an unknown path under the compat prefixes: FastAPI's 404; elsewhere our own shape", async () => {
    const a = await dstack(t, '/api/registry/main/nothing/here');
    expect(a).toMatchObject({ status: 404, json: { detail: 'Not Found' } });
    const b = await dstack(t, '/api/services/nothing', undefined, 'GET');
    expect(b).toMatchObject({ status: 404, json: { detail: 'Not Found' } });
    const c = await api(t, { path: '/api/v1/nothing', token: TOKEN });
    expect(c.status).toBe(404);
    expect(c.json).toMatchObject({ code: 'DP_ERR_NOT_FOUND' });
  });

  it('stats/collect answers the server without a token; the management API still wants one', async () => {
    const stats = await dstack(t, dstackPaths.stats, undefined, 'GET');
    expect(stats.status).toBe(200);
    const rows = stats.json as {
      project_name: string;
      run_name: string;
      stats: Record<string, { requests: number; request_time: number }>;
    }[];
    expect(rows.length).toBeGreaterThan(0);
    for (const row of rows) {
      expect(Object.keys(row.stats).sort()).toEqual(['30', '300', '60']);
      for (const w of Object.values(row.stats)) expect(w).toEqual({ requests: expect.any(Number), request_time: expect.any(Number) });
    }
    expect((await api(t, { path: '/api/v1/state' })).status).toBe(401);
  });

  it("auth_request target: a refused token gets dstack's 403 text", async () => {
    const bad = await api(t, { path: '/api/auth/main', token: 'not-a-member' });
    expect(bad.status).toBe(403);
    expect(bad.json).toEqual({ detail: 'Unauthenticated or unauthorized to access project main' });
    expect((await api(t, { path: '/api/auth/main', token: 'member-token' })).status).toBe(200);
  });

  it('a project key the document refuses: 400 naming the field, never the key', async () => {
    const secret = '-----BEGIN PRIVATE KEY-----\nU0VDUkVULU5PVC1BLUtFWQ==\n-----END PRIVATE KEY-----\n';
    const g = await generation(t);
    const r = await dstack(
      t,
      dstackPaths.registerService('keyless'),
      registerServicePayload({ runName: 'svc', project: 'keyless', sshPrivateKey: secret }),
    );
    expect(r.status).toBe(400);
    expect((r.json as { detail: string }).detail).toMatch(/sshPrivateKey: /);
    expect(r.body).not.toContain('U0VDUkVULU5PVC1BLUtFWQ');
    expect(await generation(t)).toBe(g);
  });
});

describe('off by default, loopback only', () => {
  it('without --dstack-compat the routes are absent (404)', async () => {
    const plain = await startGatewayWith();
    try {
      const r = await dstack(plain, dstackPaths.list, undefined, 'GET');
      expect(r.status).toBe(404);
      expect(
        (await dstack(plain, dstackPaths.registerService('main'), registerServicePayload({ sshPrivateKey: key.privateKey }))).status,
      ).toBe(404);
      expect(await plain.gw.store.read().then((s) => s.generation)).toBe(0);
    } finally {
      await plain.cleanup();
    }
  });

  it('a non-loopback --api-host is refused with DP_ERR_BAD_OPTION, token or not', async () => {
    const tokenFile = join(tmp.dir, 'token');
    const cases: Record<string, string>[] = [{ apiHost: '0.0.0.0' }, { apiHost: '0.0.0.0', apiTokenFile: tokenFile }];
    for (const flags of cases) {
      await expect(startCompatGateway({ flags })).rejects.toMatchObject({
        code: 'DP_ERR_BAD_OPTION',
        message: expect.stringContaining('loopback'),
      });
    }
  });
});

describe('an unexpected error', () => {
  it('is a 500 {"detail"} without the error\'s text, and is logged', async () => {
    const lines: string[] = [];
    const logger = pino({ level: 'error' }, { write: (l: string) => void lines.push(l) });
    const app = Fastify();
    const secret = 'SECRET-IN-AN-ERROR-MESSAGE';
    await dstackRoutes(app, {
      writer: { write: async () => Promise.reject(new Error(secret)) },
      read: async () => Promise.reject(new Error(secret)),
      status: t.gw.controller,
      replicaWaitS: 1,
      tls: 'wait',
      certbotTimeoutS: 1,
      signal: new AbortController().signal,
      clock: systemClock,
      version: '0.0.0',
      logger,
    });
    try {
      const r = await app.inject({
        method: 'POST',
        url: dstackPaths.registerEntrypoint('main'),
        payload: { domain: 'a.example.test', https: false },
      });
      expect(r.statusCode).toBe(500);
      expect(r.json()).toEqual({ detail: 'Internal Server Error' });
      const l = await app.inject({ method: 'GET', url: dstackPaths.list });
      expect(l.statusCode).toBe(500);
      expect(l.body).not.toContain(secret);
      expect(lines.some((x) => x.includes('dstack call failed unexpectedly'))).toBe(true);
    } finally {
      await app.close();
    }
  });
});
