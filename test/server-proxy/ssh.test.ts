// One SSH replica through a real sshd: HTTP and a WebSocket through the in-process tunnel.

import { WebSocket } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startSshdChain, type ClientKey, type TestSshd } from '../helpers/sshd.js';
import { tmpDir } from '../helpers/tmp.js';
import { send, startHarness, untilStatus, type Harness } from './harness.js';
import { startReplica, type TestReplica } from './replica.js';

let h: Harness;
let replica: TestReplica;
let sshd: TestSshd;
let key: ClientKey;
let stop: () => Promise<void>;
const scratch = tmpDir('dp-sp-ssh-');

beforeAll(async () => {
  replica = await startReplica();
  const chain = await startSshdChain(scratch.dir, 1);
  key = chain.key;
  sshd = chain.sshds[0]!;
  stop = chain.stop;
  h = await startHarness({}, { ssh: { appHost: '127.0.0.1', probeIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } });
  await h.put({
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'ssh-proj', sshPrivateKey: key.privateKey }],
      services: [
        {
          project: 'ssh-proj',
          run: 'tunnelled',
          auth: false,
          replicas: [
            {
              id: 'r0',
              appPort: replica.port,
              ssh: { host: '127.0.0.1', port: sshd.port, user: sshd.user, hostKeyFingerprint: sshd.fingerprint() },
            },
          ],
        },
      ],
    },
  });
  await untilStatus(`${h.url}/proxy/services/ssh-proj/tunnelled/echo`, 200, 20_000);
}, 60_000);

afterAll(async () => {
  await h?.close();
  await replica?.close();
  await stop?.();
  scratch.cleanup();
});

it('proxies HTTP through the SSH tunnel with one SSH login', async () => {
  for (let i = 0; i < 5; i++) {
    const r = await send(`${h.url}/proxy/services/ssh-proj/tunnelled/echo?i=${i}`, { method: 'POST', body: 'x'.repeat(100_000) });
    expect(r.status).toBe(200);
    expect(r.json<{ url: string; bodyBytes: number }>()).toMatchObject({ url: `/echo?i=${i}`, bodyBytes: 100_000 });
  }
  expect(sshd.accepted()).toBe(1);
});

it('proxies a WebSocket through the SSH tunnel', async () => {
  const ws = new WebSocket(`${h.url.replace('http:', 'ws:')}/proxy/services/ssh-proj/tunnelled/ws`);
  const got = await new Promise<string>((resolve, reject) => {
    ws.onopen = () => ws.send('over ssh');
    ws.onmessage = (ev) => resolve(String(ev.data));
    ws.onerror = () => reject(new Error('websocket error'));
  });
  expect(got).toBe('over ssh');
  ws.close();
});
