// The gateway watches state.json like the in-server proxy watches its store: a document written
// there from outside (a restore, another writer, an operator) is served without a PUT or a
// restart, and an invalid one is reported while the last good generation keeps serving.
// Real gateway, real private Nginx, a direct replica on 127.0.0.1.

import { readFile, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hashSpec, validate } from '../../src/spec/index.js';
import { api, gatewayDoc, putState, send, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';

let echo: Server;
let echoPort: number;
let t: TestGateway;

beforeAll(async () => {
  [echoPort] = (await freePorts(1)) as [number];
  echo = await startEcho('edited', { port: echoPort });
  t = await startTestGateway();
});

afterAll(async () => {
  await t?.cleanup();
  await close(echo);
});

/** state.json as the file store writes it, for `doc` at `generation`. */
function stateFile(doc: Record<string, unknown>, generation: number): string {
  const result = validate(doc);
  if (!result.ok) throw new Error(JSON.stringify(result.errors));
  const { apiVersion, kind, spec } = result.state;
  const metadata = { generation, hash: hashSpec(result.state), updatedAt: new Date().toISOString() };
  return `${JSON.stringify({ apiVersion, kind, metadata, spec }, null, 2)}\n`;
}

const generationOf = async (): Promise<number> => ((await api(t, { path: '/api/v1/status' })).json as { generation: number }).generation;

describe('gateway: state.json edited from outside', () => {
  it('serves a valid edit without a PUT, and keeps serving the last good generation over an invalid one', async () => {
    const put = await putState(t, gatewayDoc([{ run: 'first', ports: [echoPort] }]));
    expect(put.status, put.body).toBe(200);
    expect(put.json.generation).toBe(1);
    await eventually(async () => ((await send({ port: t.httpPort, host: 'first.gw.test' })).status === 200 ? true : undefined));

    // Another writer's document: generation 2 with a second service.
    const file = join(t.stateDir, 'state.json');
    await writeFile(
      file,
      stateFile(
        gatewayDoc([
          { run: 'first', ports: [echoPort] },
          { run: 'edited', ports: [echoPort] },
        ]),
        2,
      ),
    );
    const served = await eventually(async () => {
      const r = await send({ port: t.httpPort, host: 'edited.gw.test' });
      return r.status === 200 ? r : undefined;
    });
    expect(JSON.parse(served.body)).toMatchObject({ name: 'edited' });
    expect(await generationOf()).toBe(2);
    const status = (await api(t, { path: '/api/v1/status' })).json as {
      observedGeneration: number;
      store: { generation: number; lastError?: unknown };
    };
    expect(status.store).toMatchObject({ kind: 'file', generation: 2 });
    await eventually(async () =>
      ((await api(t, { path: '/api/v1/status' })).json as { observedGeneration: number }).observedGeneration === 2 ? true : undefined,
    );

    // A hand edit that breaks the hash: reported, never applied; both sites keep answering.
    const text = await readFile(file, 'utf8');
    await writeFile(file, text.replace('"run": "edited"', '"run": "edited-by-hand"'));
    const reported = await eventually(async () => {
      const s = (await api(t, { path: '/api/v1/status' })).json as { store: { lastError?: { reason: string; message: string } } };
      return s.store.lastError;
    });
    expect(reported).toMatchObject({ reason: 'invalid' });
    expect(reported.message).toMatch(/metadata\.hash does not match/);
    expect(await generationOf()).toBe(2);
    expect((await send({ port: t.httpPort, host: 'edited.gw.test' })).status).toBe(200);
    expect((await send({ port: t.httpPort, host: 'first.gw.test' })).status).toBe(200);

    // A PUT after the outside edit builds on generation 2 (not on the gateway's own last write).
    const after = await putState(t, gatewayDoc([{ run: 'first', ports: [echoPort] }]));
    expect(after.status, after.body).toBe(200);
    expect(after.json.generation).toBe(3);
    await eventually(async () => ((await send({ port: t.httpPort, host: 'edited.gw.test' })).status === 404 ? true : undefined));
  });
});
