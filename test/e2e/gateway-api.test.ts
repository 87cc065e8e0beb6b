// The gateway's HTTP API end to end, over a listening gateway with its real private Nginx:
// validation errors, YAML bodies, If-Match, body limits, the API token, dry runs, secrets.

import { chmod, readFile, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import {
  api,
  changedFiles,
  gatewayDoc,
  putState,
  send,
  siteFile,
  stampTree,
  startTestGateway,
  type PutReply,
  type TestGateway,
} from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { keyBody, TEST_KEY_A, TEST_KEY_B } from '../helpers/keys.js';

// Real keys (validation parses them); a line of each key's body stands for the secret.
const SSH_KEY = TEST_KEY_A;
const SECRET_BODY = keyBody(SSH_KEY)[3]!;
const SSH_KEY_2 = TEST_KEY_B;
const SECRET_BODY_2 = keyBody(SSH_KEY_2)[3]!;

let echo: Server;
let echoPort: number;
let t: TestGateway;

beforeAll(async () => {
  [echoPort] = (await freePorts(1)) as [number];
  echo = await startEcho('e0', { port: echoPort });
  t = await startTestGateway();
});

afterAll(async () => {
  await t?.cleanup();
  if (echo) await close(echo);
});

describe('probes', () => {
  it('/healthz and /readyz answer 200 once started', async () => {
    expect((await api(t, { path: '/healthz' })).json).toEqual({ status: 'ok' });
    const ready = await api(t, { path: '/readyz' });
    expect(ready.status).toBe(200);
    expect(ready.json).toEqual({ status: 'ready', startedAt: expect.any(Number) as number });
  });
});

describe('PUT /api/v1/state: input handling', () => {
  it('422 with a JSON pointer per schema error; nothing applied', async () => {
    const before = await api(t, { path: '/api/v1/state' });
    const doc = gatewayDoc([{ run: 'alpha', ports: [echoPort] }]) as { spec: { services: Record<string, unknown>[] } };
    doc.spec.services[0]!.bogus = true;
    doc.spec.services[0]!.clientMaxBodySize = -5;
    const r = await putState(t, doc);
    expect(r.status).toBe(422);
    expect(r.json.code).toBe('DP_ERR_INVALID_DOCUMENT');
    const paths = r.json.errors!.map((e) => e.path);
    expect(paths).toContain('/spec/services/0/bogus');
    expect(paths).toContain('/spec/services/0/clientMaxBodySize');
    for (const e of r.json.errors!) expect(e.message.length).toBeGreaterThan(0);
    expect((await api(t, { path: '/api/v1/state' })).body).toBe(before.body);
  });

  it('422 with paths for semantic errors (duplicate domain, unknown project)', async () => {
    const doc = gatewayDoc([
      { run: 'alpha', ports: [echoPort] },
      { run: 'beta', domain: 'alpha.gw.test' },
      { run: 'gamma', project: 'nowhere' },
    ]);
    const r = await putState(t, doc);
    expect(r.status).toBe(422);
    const paths = r.json.errors!.map((e) => e.path);
    expect(paths.some((p) => p.startsWith('/spec/services/1'))).toBe(true);
    expect(paths.some((p) => p.startsWith('/spec/services/2'))).toBe(true);
    await expect(readFile(siteFile(t, 'alpha.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('accepts YAML with Content-Type application/yaml', async () => {
    const r = await putState(t, stringify(gatewayDoc([{ run: 'yaml', ports: [echoPort] }])), { contentType: 'application/yaml' });
    expect(r.status, r.body).toBe(200);
    expect(r.json.changed).toBe(true);
    const state = (await api(t, { path: '/api/v1/state' })).json as { spec: { services: { run: string }[] } };
    expect(state.spec.services.map((s) => s.run)).toEqual(['yaml']);
    const site = await send({ port: t.httpPort, host: 'yaml.gw.test' });
    expect(JSON.parse(site.body)).toMatchObject({ name: 'e0' });
  });

  it('415 on another content type, 400 on malformed JSON or YAML', async () => {
    const doc = gatewayDoc([{ run: 'other' }]);
    const text = await putState(t, JSON.stringify(doc), { contentType: 'text/plain' });
    expect(text.status).toBe(415);
    expect(text.json).toMatchObject({ code: 'DP_ERR_UNSUPPORTED_MEDIA_TYPE' });
    const badJson = await putState(t, '{"apiVersion": ', { contentType: 'application/json' });
    expect(badJson.status).toBe(400);
    expect(badJson.json).toMatchObject({ code: 'DP_ERR_MALFORMED_DOCUMENT' });
    const badYaml = await putState(t, 'spec: [unclosed', { contentType: 'application/yaml' });
    expect(badYaml.status).toBe(400);
    await expect(readFile(siteFile(t, 'other.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('409 on a stale If-Match, 200 on the current one', async () => {
    const current = (await api(t, { path: '/api/v1/state' })).json as { metadata: { generation: number } };
    const g = current.metadata.generation;
    const doc = gatewayDoc([{ run: 'yaml', ports: [echoPort] }, { run: 'matched' }]);
    const stale = await putState(t, doc, { ifMatch: String(g - 1) });
    expect(stale.status).toBe(409);
    expect(stale.json).toMatchObject({ code: 'DP_ERR_GENERATION_MISMATCH', generation: g });
    await expect(readFile(siteFile(t, 'matched.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });
    const ok = await putState(t, doc, { ifMatch: `"${g}"` });
    expect(ok.status).toBe(200);
    expect(ok.json.generation).toBe(g + 1);
    // The answer of an applying PUT is the document's changes; the loops' actions are the dry run's.
    expect(ok.json.plan.document.changes).toContainEqual({ kind: 'service', key: 'main/matched', op: 'added' });
    expect(ok.json.plan.loops).toEqual({});
    expect(await readFile(siteFile(t, 'matched.gw.test'), 'utf8')).toContain('server_name matched.gw.test;');
  });

  it('413 on a body over 16 MiB', async () => {
    const body = JSON.stringify({ ...gatewayDoc([]), padding: 'x'.repeat(16 * 1024 * 1024 + 10) });
    const r = await api(t, { method: 'PUT', path: '/api/v1/state', body });
    expect(r.status).toBe(413);
    expect(r.json).toMatchObject({ code: 'DP_ERR_DOCUMENT_TOO_LARGE' });
  });
});

describe('dry run', () => {
  it('returns the plan with unified diffs and `changed`, and changes nothing', async () => {
    const stateBefore = (await api(t, { path: '/api/v1/state' })).body;
    const filesBefore = await stampTree(t.gw.paths.confDir);
    const stateFileBefore = (await stampTree(t.stateDir)).get('state.json');
    const reloads = t.gw.nginxStats.reloads;
    const doc = gatewayDoc([
      { run: 'yaml', ports: [echoPort], clientMaxBodySize: 1234 },
      { run: 'planned', ports: [echoPort] },
    ]);
    const r = await putState(t, doc, { dryRun: true });
    expect(r.status, r.body).toBe(200);
    expect(r.json.dryRun).toBe(true);
    expect(r.json.changed).toBe(true);
    const actions = r.json.plan.loops.nginx!.actions;
    const byKey = new Map(actions.map((a) => [a.key, a]));
    expect(byKey.get('sites/planned.gw.test.conf')?.kind).toBe('create');
    expect(byKey.get('sites/matched.gw.test.conf')?.kind).toBe('delete');
    const update = byKey.get('sites/yaml.gw.test.conf');
    expect(update?.kind).toBe('update');
    expect(update?.diff).toMatch(/^--- /m);
    expect(update?.diff).toMatch(/^\+\+\+ /m);
    expect(update?.diff).toMatch(/^@@ /m);
    expect(update?.diff).toMatch(/^-\s*client_max_body_size \d+;$/m);
    expect(update?.diff).toMatch(/^\+\s*client_max_body_size 1234;$/m);
    expect(r.json.plan.loops.nginx!.notes).toEqual({ reload: true });

    expect(changedFiles(filesBefore, await stampTree(t.gw.paths.confDir))).toEqual([]);
    expect((await stampTree(t.stateDir)).get('state.json')).toEqual(stateFileBefore);
    expect((await api(t, { path: '/api/v1/state' })).body).toBe(stateBefore);
    expect(t.gw.nginxStats.reloads).toBe(reloads);

    // The current document, dry-run: nothing to do.
    const current = (await api(t, { path: '/api/v1/state' })).json as Record<string, unknown>;
    delete current.metadata;
    const same = await putState(t, current, { dryRun: true });
    expect(same.json.changed, same.body).toBe(false);
    expect(same.json.plan.loops.nginx!.actions).toEqual([]);
  });
});

describe('secrets', () => {
  const docWithKey = (key: string) => gatewayDoc([{ run: 'secret', ports: [echoPort] }, { run: 'idle' }], { sshPrivateKey: key });

  it('never returns a private key: GET state, PUT reply, dry-run plan', async () => {
    const put = await putState(t, docWithKey(SSH_KEY));
    expect(put.status, put.body).toBe(200);
    expect(put.body).not.toContain(SECRET_BODY);

    const get = await api(t, { path: '/api/v1/state' });
    expect(get.body).not.toContain(SECRET_BODY);
    const state = get.json as { spec: { projects: { name: string; sshPrivateKey?: string }[] } };
    expect(state.spec.projects.find((p) => p.name === 'main')?.sshPrivateKey).toBe('<redacted>');
    const yaml = await api(t, { path: '/api/v1/state', headers: { accept: 'application/yaml' } });
    expect(yaml.headers['content-type']).toMatch(/yaml/);
    expect(yaml.body).not.toContain(SECRET_BODY);

    // Changing the key: the plan says the field changed, never what it holds.
    const dry = await putState(t, docWithKey(SSH_KEY_2), { dryRun: true });
    expect(dry.json.changed).toBe(true);
    expect(dry.body).not.toContain(SECRET_BODY);
    expect(dry.body).not.toContain(SECRET_BODY_2);
    const change = dry.json.plan.document.changes.find((c) => c.kind === 'project' && c.key === 'main');
    expect(change?.fields?.find((f) => f.field === 'sshPrivateKey')).toMatchObject({ secret: true });

    const put2 = await putState(t, docWithKey(SSH_KEY_2));
    expect(put2.json.changed).toBe(true);
    expect(put2.body).not.toContain(SECRET_BODY);
    expect(put2.body).not.toContain(SECRET_BODY_2);
    const status = await api(t, { path: '/api/v1/status' });
    expect(status.body).not.toContain(SECRET_BODY_2);
    // Nor does any Nginx file hold it.
    for (const name of (await stampTree(t.gw.paths.confDir)).keys()) {
      expect(await readFile(join(t.gw.paths.confDir, name), 'utf8')).not.toContain(SECRET_BODY_2);
    }
  });
});

describe('API token', () => {
  let tg: TestGateway;
  let dir: { dir: string; cleanup: () => void };
  const TOKEN = 'test-token-0123456789abcdef';

  beforeAll(async () => {
    dir = tmpDir('dp-e2e-token-');
    const file = join(dir.dir, 'token');
    await writeFile(file, `${TOKEN}\n`);
    await chmod(file, 0o600);
    tg = await startTestGateway({ apiTokenFile: file });
  });
  afterAll(async () => {
    await tg?.cleanup();
    dir?.cleanup();
  });

  it('401 without or with a wrong token, 200 with it; probes stay open', async () => {
    const doc = gatewayDoc([{ run: 'alpha', ports: [echoPort] }]);
    for (const path of ['/api/v1/state', '/api/v1/status']) {
      const none = await api(tg, { path });
      expect(none.status, path).toBe(401);
      expect(none.json).toMatchObject({ code: 'DP_ERR_UNAUTHORIZED' });
      expect((await api(tg, { path, token: 'wrong-token-0123456789' })).status, path).toBe(401);
      expect((await api(tg, { path, token: TOKEN })).status, path).toBe(200);
    }
    const denied = await putState(tg, doc);
    expect(denied.status).toBe(401);
    await expect(readFile(siteFile(tg, 'alpha.gw.test'))).rejects.toMatchObject({ code: 'ENOENT' });
    const dryDenied = await putState(tg, doc, { dryRun: true });
    expect(dryDenied.status).toBe(401);
    const ok = await putState(tg, doc, { token: TOKEN });
    expect(ok.status).toBe(200);
    expect((ok.json as PutReply).changed).toBe(true);
    expect((await api(tg, { path: '/healthz' })).status).toBe(200);
    expect((await api(tg, { path: '/readyz' })).status).toBe(200);
  });
});

describe('API port 0', () => {
  it('sends the model API entrypoint and token checks to the data plane, whatever port the API listens on', async () => {
    const t0 = await startTestGateway({ apiPort0: true });
    try {
      expect(t0.apiPort).toBeGreaterThan(0);
      const doc = gatewayDoc([{ run: 'guarded', auth: true, ports: [echoPort] }]);
      (doc.spec as Record<string, unknown>).entrypoints = [{ project: 'main', domain: 'models.gw.test' }];
      const r = await putState(t0, doc);
      expect(r.status, r.body).toBe(200);
      const text = await readFile(siteFile(t0, 'models.gw.test'), 'utf8');
      // Through the data-plane socket, which gives the connection to the API's server: a
      // take-over moves it without a gap, where the API's port changes hands.
      expect(text).toMatch(/proxy_pass http:\/\/unix:\/\S+\/dataplane\.sock:\/api\/models\/main\/;/);
      expect(text).toContain('proxy_set_header X-Dstack-Proxy-Service model-api;');
      const models = await send({ port: t0.httpPort, host: 'models.gw.test', path: '/models' });
      // The model API's own answer (no control server here to pass a token).
      expect(models.status, models.body).toBe(403);
      expect(JSON.parse(models.body)).toMatchObject({ error: { type: 'permission_error' } });
      // A service's token check goes to the data plane, not the API port.
      expect(await readFile(siteFile(t0, 'guarded.gw.test'), 'utf8')).toContain('proxy_set_header X-Dstack-Proxy-Service auth-check:main;');
    } finally {
      await t0.cleanup();
    }
  });
});
