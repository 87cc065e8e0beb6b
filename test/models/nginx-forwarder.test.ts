// The gateway's path with the real Nginx: the model API forwards through Nginx's internal listener
// with the service's Host (no auth_request there, counted in the access log the stats loop reads), and an
// entrypoint site proxies `/` to `<apiUrl>/api/models/<project>/`. Sites rendered by the real
// nginx loop renderer. The OpenAI SDK talks to the entrypoint domain through Nginx.

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nginxForwarder } from '../../src/models/forwarders.js';
import type { Forwarder } from '../../src/models/types.js';
import { buildViews } from '../../src/reconcilers/nginx/view.js';
import { renderAll } from '../../src/reconcilers/nginx/render.js';
import type { ProxyState } from '../../src/spec/types.js';
import { eventually, startTestNginx, type TestNginx } from '../helpers/nginx.js';
import { documentFor, startApi, type ApiHarness } from './fixtures.js';
import { Gate, startOpenAIReplica, startTgiReplica, type Replica } from './replicas.js';

let nginx: TestNginx;
let oa: Replica;
let tgi: Replica;
let api: ApiHarness;
let forwarder: Forwarder;
let gate: Gate | undefined;
let dispatcher: Agent;

/** Every host name resolves to 127.0.0.1, so the SDK can use the entrypoint's domain. */
function loopbackAgent(): Agent {
  return new Agent({
    connect: {
      lookup: (_host: string, opts: { all?: boolean }, cb: (...args: unknown[]) => void) =>
        opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4),
    } as object,
  });
}

beforeAll(async () => {
  nginx = await startTestNginx();
  oa = await startOpenAIReplica(() => gate);
  tgi = await startTgiReplica(() => gate);
  const doc: ProxyState = documentFor({ openai: oa.port, tgi: tgi.port });
  doc.spec.entrypoints.push({ project: 'main', domain: 'gateway.gw.test', https: false });
  const internalSocket = join(nginx.dir, 'internal', 'nginx.sock');
  await mkdir(dirname(internalSocket), { mode: 0o700 });
  forwarder = nginxForwarder({ socketPath: internalSocket });
  api = await startApi(doc, { forwarder });
  const views = buildViews(doc, {
    httpPort: nginx.httpPort,
    httpsPort: nginx.httpsPort,
    apiUrl: api.baseUrl,
    acmeWebroot: nginx.acmeWebroot,
    accessLogPath: nginx.accessLogPath,
    internalSocket,
  });
  for (const [name, text] of renderAll(views)) {
    const path = join(nginx.paths.confDir, name);
    await mkdir(dirname(path), { recursive: true });
    await writeFile(path, text);
  }
  await mkdir(nginx.acmeWebroot, { recursive: true });
  await nginx.reload();
  dispatcher = loopbackAgent();
}, 60_000);

afterAll(async () => {
  await api?.close();
  await oa?.close();
  await tgi?.close();
  await dispatcher?.close();
  await nginx?.stop();
});

const user = [{ role: 'user' as const, content: 'Hi' }];

function entrypointClient(token = 'good'): OpenAI {
  return new OpenAI({
    apiKey: token,
    baseURL: `http://gateway.gw.test:${nginx.httpPort}`,
    maxRetries: 0,
    fetch: ((url: string, init: Record<string, unknown>) => undiciFetch(url, { ...init, dispatcher })) as unknown as typeof fetch,
  });
}

describe('through the gateway’s Nginx', () => {
  it('forwards with the service’s Host on the internal listener, and is counted in the access log', async () => {
    const before = oa.received.length;
    const res = await api.client().chat.completions.create({ model: 'org/oa-model', messages: user });
    expect(res.choices[0]!.message.content).toBe('Hello world');
    expect(oa.received[before]!.url).toBe('/v1/chat/completions');
    expect(oa.received[before]!.headers.host).toBe('oa.gw.test');
    await eventually(async () =>
      (await readFile(nginx.accessLogPath, 'utf8').catch(() => '')).includes(' oa.gw.test 200 ') ? true : undefined,
    );
  });

  it('an entrypoint domain serves the API to the SDK: list, create, and a stream that is not buffered', async () => {
    const client = entrypointClient();
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['a-idle-model', 'org/oa-model', 'tgi-model']);
    const tgiRes = await client.chat.completions.create({ model: 'tgi-model', messages: user });
    expect(tgiRes.choices[0]!.message.content).toBe('Hello there');

    gate = new Gate();
    const g = gate;
    const stream = await client.chat.completions.create({ model: 'tgi-model', messages: user, stream: true });
    let firstBeforeRelease: boolean | undefined;
    const parts: string[] = [];
    for await (const chunk of stream) {
      if (firstBeforeRelease === undefined) {
        firstBeforeRelease = !g.released;
        g.release();
      }
      parts.push(chunk.choices[0]?.delta.content ?? '');
    }
    expect(firstBeforeRelease).toBe(true);
    expect(parts.join('')).toBe('Hello there');

    gate = new Gate();
    const g2 = gate;
    const oaStream = await client.chat.completions.create({ model: 'org/oa-model', messages: user, stream: true });
    let oaFirstBeforeRelease: boolean | undefined;
    for await (const _chunk of oaStream) {
      if (oaFirstBeforeRelease === undefined) {
        oaFirstBeforeRelease = !g2.released;
        g2.release();
      }
    }
    expect(oaFirstBeforeRelease).toBe(true);
    gate = undefined;
  });

  it('a wrong token through the entrypoint is PermissionDenied', async () => {
    await expect(entrypointClient('bad').models.list()).rejects.toBeInstanceOf(OpenAI.PermissionDeniedError);
  });
});
