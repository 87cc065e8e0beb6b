// Per-replica conditions against real sshd: AuthFailed, ConnectFailed, HostKeyMismatch (pinned
// and trust-on-first-use), AppPortUnreachable with no traffic sent there; no key in messages.

import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { close, startEcho } from '../../helpers/http.js';
import { freePort, freePorts } from '../../helpers/ports.js';
import { generateKey, startSshdChain, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

let tmp: ReturnType<typeof tmpDir>;
let key: ClientKey;
let sshd: TestSshd;
let stopSshds: () => Promise<void>;
let echo: Server;
let appPort: number;
const harnesses: Harness[] = [];

const hop = (): { host: string; port: number; user: string } => ({ host: '127.0.0.1', port: sshd.port, user: sshd.user });
async function harness(...args: Parameters<typeof startHarness>): Promise<Harness> {
  const h = await startHarness(...args);
  harnesses.push(h);
  return h;
}

beforeAll(async () => {
  tmp = tmpDir('dp-ssh-cond-');
  const chain = await startSshdChain(tmp.dir, 1);
  key = chain.key;
  sshd = chain.sshds[0]!;
  stopSshds = chain.stop;
  appPort = await freePort();
  echo = await startEcho('app', { port: appPort });
});

afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.close()));
  await stopSshds?.();
  if (echo) await close(echo);
  tmp?.cleanup();
});

describe('replica conditions', () => {
  it('wrong key → AuthFailed, and the key never shows in a condition', async () => {
    const wrong = generateKey(join(tmp.dir, 'wrong_ed25519'));
    const h = await harness(specOf(wrong.privateKey, { app: [{ id: 'w1', appPort, ssh: hop() }] }));
    const c = await h.waitReason('main/app', 'w1', 'AuthFailed');
    expect(c.status).toBe('False');
    expect(c.message).not.toMatch(/PRIVATE KEY|BEGIN/);
    expect(c.message).not.toContain(wrong.privateKey.split('\n')[1]!.slice(0, 20));
    expect((await h.get('main/app')).status).toBe(503);
  });

  it('closed port → ConnectFailed', async () => {
    const closed = await freePort();
    const h = await harness(specOf(key.privateKey, { app: [{ id: 'c1', appPort, ssh: { ...hop(), port: closed } }] }));
    const c = await h.waitReason('main/app', 'c1', 'ConnectFailed');
    expect(c.message).toMatch(/ECONNREFUSED/);
  });

  it('a pinned fingerprint that does not match → HostKeyMismatch; the right one connects', async () => {
    const other = 'SHA256:' + 'A'.repeat(43);
    const h = await harness(specOf(key.privateKey, { app: [{ id: 'p1', appPort, ssh: { ...hop(), hostKeyFingerprint: other } }] }));
    await h.waitReason('main/app', 'p1', 'HostKeyMismatch');
    await h.put(specOf(key.privateKey, { app: [{ id: 'p1', appPort, ssh: { ...hop(), hostKeyFingerprint: sshd.fingerprint() } }] }));
    await h.waitReason('main/app', 'p1', 'Connected');
  });

  it('a host key that changes on reconnect → HostKeyMismatch (trust on first use)', async () => {
    const h = await harness(specOf(key.privateKey, { app: [{ id: 't1', appPort, ssh: hop() }] }));
    await h.waitReason('main/app', 't1', 'Connected');
    await sshd.restart({ newHostKey: true });
    const c = await h.waitReason('main/app', 't1', 'HostKeyMismatch');
    expect(c.message).toMatch(/changed from SHA256:.* to SHA256:/);
    expect((await h.get('main/app')).status).toBe(503);
  });

  it('app port closed on the replica → AppPortUnreachable, and no traffic is sent there', async () => {
    const [deadPort] = await freePorts(1);
    const h = await harness(
      specOf(key.privateKey, {
        app: [
          { id: 'good', appPort, ssh: hop() },
          { id: 'dead', appPort: deadPort!, ssh: hop() },
        ],
      }),
    );
    await h.waitReason('main/app', 'good', 'Connected');
    await h.waitReason('main/app', 'dead', 'AppPortUnreachable');
    const sentToDead = (): number | undefined => h.loop.replicas.loads().find((l) => l.replica === 'dead')?.requests;
    const before = sentToDead();
    for (let i = 0; i < 20; i++) expect(echoName(await h.get('main/app'))).toBe('app');
    expect(sentToDead()).toBe(before);
  });
});
