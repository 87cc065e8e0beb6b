// A PUT whose state write the storage refuses — a full disk (a tiny tmpfs), a read-only mount
// (a read-only bind mount of the state dir) — answers 503 DP_ERR_STATE_WRITE naming the file
// and the OS reason, leaves no temp file, and the previous generation keeps serving through
// the real Nginx. Needs root for the mounts (tests run as root here); skipped without.

import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../helpers/http.js';
import { api, gatewayDoc, GW_DOMAIN, putState, send, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { freePort } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

const tmp = tmpDir('dp-enospc-');
const stateDir = join(tmp.dir, 'state');
mkdirSync(stateDir, { recursive: true });
// 8 MiB: room for the private Nginx's prefix, logs and the first document.
const canMount = process.getuid?.() === 0 && spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=8m,mode=0700', 'tmpfs', stateDir]).status === 0;
const mounts: string[] = canMount ? [stateDir] : [];

let t: TestGateway;
let echo: Server;
let echoPort: number;

const docA = () => gatewayDoc([{ run: 'kept', ports: [echoPort] }]);
/** Larger than what is left on the full disk. */
const docB = () =>
  gatewayDoc([{ run: 'kept', ports: [echoPort] }, ...Array.from({ length: 200 }, (_, i) => ({ run: `new-${i}`, ports: [echoPort] }))]);

const temps = (): string[] => readdirSync(stateDir).filter((n) => n.startsWith('.state.json.tmp-'));
const served = async (): Promise<number> => (await send({ port: t.httpPort, host: `kept.${GW_DOMAIN}` })).status;
const generation = async (): Promise<number> =>
  ((await api(t, { path: '/api/v1/state' })).json as { metadata: { generation: number } }).metadata.generation;

beforeAll(async () => {
  if (!canMount) return;
  echoPort = await freePort();
  echo = await startEcho('kept', { port: echoPort });
  t = await startTestGateway({ stateDir });
  const r = await putState(t, docA());
  expect(r.status).toBe(200);
  expect(await served()).toBe(200);
}, 60_000);

afterAll(async () => {
  await t?.close();
  if (echo) await close(echo);
  for (const m of mounts.reverse()) spawnSync('umount', ['-l', m]);
  tmp.cleanup();
});

describe.skipIf(!canMount)('a state write the storage refuses', () => {
  it('a full disk: 503 DP_ERR_STATE_WRITE with ENOSPC and the file, no temp file, the old generation serves', async () => {
    const filler = join(stateDir, 'filler');
    const chunk = Buffer.alloc(64 * 1024, 1);
    try {
      for (;;) writeFileSync(filler, chunk, { flag: 'a' });
    } catch (err) {
      expect((err as NodeJS.ErrnoException).code).toBe('ENOSPC');
    }
    try {
      for (let attempt = 0; attempt < 3; attempt++) {
        const r = await putState(t, docB());
        expect(r.status).toBe(503);
        expect(r.json).toMatchObject({ code: 'DP_ERR_STATE_WRITE', errno: 'ENOSPC', file: join(stateDir, 'state.json') });
        expect((r.json as unknown as { message: string }).message).toMatch(/no space left on the device \(ENOSPC\)/);
        expect(temps()).toEqual([]);
      }
      expect(await generation()).toBe(1);
      expect(await served()).toBe(200);
    } finally {
      rmSync(filler, { force: true });
    }
  }, 60_000);

  it('a read-only state dir: 503 DP_ERR_STATE_WRITE with EROFS, the old generation serves, and a later PUT works', async () => {
    execFileSync('mount', ['--bind', stateDir, stateDir]);
    mounts.push(stateDir);
    execFileSync('mount', ['-o', 'remount,bind,ro', stateDir]);
    const r = await putState(t, docB());
    expect(r.status).toBe(503);
    expect(r.json).toMatchObject({ code: 'DP_ERR_STATE_WRITE', errno: 'EROFS' });
    expect((r.json as unknown as { message: string }).message).toContain(join(stateDir, 'state.json'));
    expect(temps()).toEqual([]);
    expect(await generation()).toBe(1);
    expect(await served()).toBe(200);

    execFileSync('umount', [stateDir]);
    mounts.pop();
    const ok = await putState(t, docB());
    expect(ok.status).toBe(200);
    expect(ok.json.generation).toBe(2);
    expect(temps()).toEqual([]);
  }, 60_000);
});
