// `created` of GET /models: when the model first appeared, kept across re-PUTs and restarts.

import { readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import Fastify from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { installErrorHandlers } from '../../src/api/errors.js';
import { fileFirstSeenStore } from '../../src/models/first-seen.js';
import { registerModelApi } from '../../src/models/plugin.js';
import { tmpDir } from '../helpers/tmp.js';
import { documentFor, startApi } from './fixtures.js';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

describe('fileFirstSeenStore', () => {
  it('records new keys, keeps old ones, forgets removed ones; the file is 0600 JSON', async () => {
    const t = tmpDir();
    cleanups.push(t.cleanup);
    const path = join(t.dir, 'models.json');
    const store = fileFirstSeenStore(path);
    expect([...(await store.sync(['p/a'], 100))]).toEqual([['p/a', 100]]);
    expect([...(await store.sync(['p/a', 'p/b'], 200))]).toEqual([
      ['p/a', 100],
      ['p/b', 200],
    ]);
    expect(JSON.parse(await readFile(path, 'utf8'))).toEqual({ version: 1, firstSeen: { 'p/a': 100, 'p/b': 200 } });
    expect((await stat(path)).mode & 0o777).toBe(0o600);
    // A restart reads the file back.
    const again = fileFirstSeenStore(path);
    expect([...(await again.sync(['p/b'], 300))]).toEqual([['p/b', 200]]);
    expect([...(await again.sync(['p/a', 'p/b'], 400))]).toEqual([
      ['p/a', 400],
      ['p/b', 200],
    ]);
  });

  it('starts afresh from a corrupt file', async () => {
    const t = tmpDir();
    cleanups.push(t.cleanup);
    const path = join(t.dir, 'models.json');
    await writeFile(path, '{not json');
    expect([...(await fileFirstSeenStore(path).sync(['p/a'], 5))]).toEqual([['p/a', 5]]);
  });
});

describe('created on the API', () => {
  it('stays across a re-PUT (a new document object) and a restart; a new model gets its own time', async () => {
    const t = tmpDir();
    cleanups.push(t.cleanup);
    const path = join(t.dir, 'models.json');
    let now = Date.UTC(2025, 0, 1);
    const doc = documentFor({ openai: 1, tgi: 1 });
    const api = await startApi(doc, { firstSeen: fileFirstSeenStore(path), now: () => now });
    cleanups.push(() => api.close());
    const list = async (a = api) => (await a.client().models.list()).data.map((m) => [m.id, m.created]);
    const t0 = Date.UTC(2025, 0, 1) / 1000;
    expect(await list()).toEqual([
      ['a-idle-model', t0],
      ['org/oa-model', t0],
      ['tgi-model', t0],
    ]);

    now += 3_600_000;
    const next = structuredClone(doc);
    next.spec.services[2]!.model = { name: 'b-new-model', format: 'openai', prefix: '/v1' };
    api.state.current = next;
    expect(await list()).toEqual([
      ['b-new-model', t0 + 3600],
      ['org/oa-model', t0],
      ['tgi-model', t0],
    ]);

    now += 3_600_000;
    const restarted = await startApi(structuredClone(next), { firstSeen: fileFirstSeenStore(path), now: () => now });
    cleanups.push(() => restarted.close());
    expect(await list(restarted)).toEqual([
      ['b-new-model', t0 + 3600],
      ['org/oa-model', t0],
      ['tgi-model', t0],
    ]);
  });
});

describe('mounting', () => {
  it('serves a fixed project at a prefix without :project', async () => {
    const app = Fastify();
    cleanups.push(() => app.close());
    await registerModelApi(app, {
      prefix: '',
      project: 'main',
      getState: () => documentFor({ openai: 1, tgi: 1 }),
      authorize: async (p, tok) => (p === 'main' && tok === 'good' ? 'allow' : 'deny'),
      forward: async () => {
        throw new Error('not used');
      },
    });
    const res = await app.inject({ url: '/models', headers: { authorization: 'Bearer good' } });
    expect(res.statusCode).toBe(200);
    expect((res.json() as { data: unknown[] }).data).toHaveLength(3);
    expect((await app.inject({ url: '/models' })).statusCode).toBe(403);
  });

  it('mounts beside the gateway API’s own error handlers; unknown paths under the prefix are 404 in this API’s shape', async () => {
    const app = Fastify();
    cleanups.push(() => app.close());
    installErrorHandlers(app);
    app.get('/healthz', async () => ({ status: 'ok' }));
    app.post('/echo', async (req) => req.body);
    await registerModelApi(app, {
      prefix: '/api/models/:project',
      getState: () => documentFor({ openai: 1, tgi: 1 }),
      authorize: async (_p, tok) => (tok === 'good' ? 'allow' : 'deny'),
      forward: async () => {
        throw new Error('not used');
      },
    });
    const auth = { authorization: 'Bearer good' };
    expect((await app.inject({ url: '/healthz' })).statusCode).toBe(200);
    expect((await app.inject({ url: '/api/models/main/models', headers: auth })).statusCode).toBe(200);
    const missing = await app.inject({ url: '/api/models/main/v1/embeddings', headers: auth });
    expect(missing.statusCode).toBe(404);
    expect(missing.json()).toMatchObject({ detail: 'Not Found' });
    expect((await app.inject({ url: '/elsewhere' })).json()).toMatchObject({ code: 'DP_ERR_NOT_FOUND' });
    // The models API's body parser does not leak into the rest of the app.
    const echo = await app.inject({ method: 'POST', url: '/echo', payload: { a: 1 } });
    expect(echo.json()).toEqual({ a: 1 });
  });

  it('refuses a prefix without :project and no project', async () => {
    await expect(
      registerModelApi(Fastify(), {
        prefix: '',
        getState: () => documentFor({ openai: 1, tgi: 1 }),
        authorize: async () => 'allow',
        forward: async () => {
          throw new Error('x');
        },
      }),
    ).rejects.toThrow(/needs `project`/);
  });
});
