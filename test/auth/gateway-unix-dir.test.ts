// The gateway with `--server-url unix-dir:<dir>` behind real Nginx: an auth: true service whose
// token checks reach the control server through whichever socket of the directory answers, as
// dstack's gateway reaches its server's processes through their reverse SSH forwards.

import type { Server } from 'node:http';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { call, directReplica, integrationDoc, startGatewayWith } from '../e2e/integration-harness.js';
import { deadSocket, liveSocket, type LiveSocket } from './socket-dir.js';

const PRIVATE = 'private.gw.test';

let tmp: ReturnType<typeof tmpDir>;
let dir: string;
let t: TestGateway;
let echo: Server;
const sockets: LiveSocket[] = [];
let echoHits = 0;

beforeAll(async () => {
  tmp = tmpDir('dp-auth-gw-');
  dir = join(tmp.dir, 'server-connections');
  mkdirSync(dir, { mode: 0o700 });
  sockets.push(await liveSocket(join(dir, 'a.sock')), await liveSocket(join(dir, 'b.sock')));
  await deadSocket(join(dir, 'stale.sock'));
  const [port] = (await freePorts(1)) as [number];
  echo = await startEcho('private', { port });
  echo.on('request', () => echoHits++);
  t = await startGatewayWith({ serverUrl: `unix-dir:${dir}`, authCacheTtl: '60' });
  const r = await putState(
    t,
    integrationDoc({ services: [{ run: 'private', domain: PRIVATE, auth: true, replicas: [directReplica('r0', port)] }] }),
  );
  expect(r.status).toBe(200);
});

afterAll(async () => {
  await t?.cleanup();
  for (const s of sockets) await s.close();
  if (echo) await close(echo);
  tmp?.cleanup();
});

/** A request from 127.0.0.2: Nginx treats it as a remote client. */
const remote = (token?: string) =>
  call({
    port: t.httpPort,
    host: PRIVATE,
    path: '/data',
    localAddress: '127.0.0.2',
    ...(token !== undefined ? { headers: { authorization: `Bearer ${token}` } } : {}),
  });

const calls = () => sockets.reduce((n, s) => n + s.calls.length, 0);

describe('gateway: token checks through a socket directory', () => {
  it('401 without a token, 403 for a non-member, 200 for members spread over the live sockets', async () => {
    expect((await remote()).status).toBe(401);
    expect((await remote('outsider-0123456789')).status).toBe(403);
    for (let i = 0; i < 30; i++) expect((await remote(`member-gw-${i}-0123456789`)).status).toBe(200);
    expect(sockets[0]!.calls.length).toBeGreaterThan(0);
    expect(sockets[1]!.calls.length).toBeGreaterThan(0);
    expect(calls()).toBe(31);
    // Cached: the same member again asks nobody.
    expect((await remote('member-gw-0-0123456789')).status).toBe(200);
    expect(calls()).toBe(31);
  });

  it('refuses when no socket answers (as for an unreachable server), and recovers when one appears', async () => {
    for (const s of sockets.splice(0)) await s.close();
    await deadSocket(join(dir, 'a.sock'));
    const before = echoHits;
    const refused = await remote('member-gw-new-0123456789');
    // The auth target answers 503; Nginx turns a failed auth subrequest into a 500.
    expect(refused.status).toBe(500);
    expect(echoHits).toBe(before);
    sockets.push(await liveSocket(join(dir, 'c.sock')));
    expect((await remote('member-gw-new-0123456789')).status).toBe(200);
    expect(sockets[0]!.calls).toEqual(['main member-gw-new-0123456789']);
  });
});
