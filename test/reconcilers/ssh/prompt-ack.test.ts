// Prompt ACKs for sshd's Nagle: ackPromptly sends one nudge after unanswered arrivals and none
// when the client answered; SSH_MSG_IGNORE from ignoreSender is accepted by a real sshd on a
// direct hop and through a jump host, and the tunnel keeps carrying requests.

import type { Server } from 'node:http';
import { Duplex } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from 'ssh2';
import { HostKeyBook } from '../../../src/reconcilers/ssh/host-keys.js';
import { ackPromptly } from '../../../src/reconcilers/ssh/prompt-ack.js';
import { connectChain, forwardOut } from '../../../src/reconcilers/ssh/ssh-chain.js';
import { ignoreSender } from '../../../src/ssh2.js';
import { close, startEcho } from '../../helpers/http.js';
import { freePort } from '../../helpers/ports.js';
import { startSshdChain, type ClientKey, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { FakeClock } from '../../helpers/fake-clock.js';
import { systemClock } from '../../../src/clock.js';

/** A transport whose writes are recorded and whose reads are pushed by the test. */
function fakeTransport(): { t: Duplex; written: string[] } {
  const written: string[] = [];
  const t = new Duplex({
    read() {},
    write(chunk: Buffer, _enc, cb) {
      written.push(chunk.toString());
      cb();
    },
  });
  t.on('data', () => undefined); // the SSH client reading
  return { t, written };
}

/** Lets the stream deliver what was pushed ('data' events run on later ticks). */
const delivered = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('ackPromptly', () => {
  it('nudges once, after the delay, for bytes that arrived and nothing answered', async () => {
    const clock = new FakeClock();
    const { t } = fakeTransport();
    let nudges = 0;
    ackPromptly(t, () => nudges++, { clock, delayMs: 10 });
    t.push(Buffer.from('a'));
    t.push(Buffer.from('b'));
    await delivered();
    clock.advance(9);
    expect(nudges).toBe(0);
    clock.advance(1);
    expect(nudges).toBe(1); // one nudge pays for every arrival before it
    clock.advance(1_000);
    expect(nudges).toBe(1);
    expect(clock.pendingTimers()).toBe(0);
    t.destroy();
  });

  it('waits out a debt younger than its timer', async () => {
    const clock = new FakeClock();
    const { t } = fakeTransport();
    let nudges = 0;
    ackPromptly(t, () => nudges++, { clock, delayMs: 10 });
    t.push(Buffer.from('a'));
    await delivered();
    clock.advance(6);
    t.write(Buffer.from('answer')); // paid
    t.push(Buffer.from('b')); // owed again, 6 ms into the first timer
    await delivered();
    clock.advance(4); // the first timer: the new debt is 4 ms old
    expect(nudges).toBe(0);
    clock.advance(6);
    expect(nudges).toBe(1);
    t.destroy();
  });

  it('does not nudge when the client wrote after the arrival', async () => {
    const clock = new FakeClock();
    const { t, written } = fakeTransport();
    let nudges = 0;
    ackPromptly(t, () => nudges++, { clock, delayMs: 10 });
    t.once('data', () => t.write(Buffer.from('reply'))); // ssh2 answering while it parses
    t.push(Buffer.from('request'));
    await delivered();
    clock.advance(50);
    expect(nudges).toBe(0);
    expect(written).toEqual(['reply']);
    t.destroy();
  });

  it('does not nudge a transport that closed, and leaves no timer', async () => {
    const clock = new FakeClock();
    const { t } = fakeTransport();
    let nudges = 0;
    ackPromptly(t, () => nudges++, { clock });
    t.push(Buffer.from('a'));
    await delivered();
    t.destroy();
    await delivered();
    clock.advance(20);
    expect(nudges).toBe(0);
    expect(clock.pendingTimers()).toBe(0);
  });
});

describe('SSH_MSG_IGNORE on a real sshd', () => {
  let tmp: ReturnType<typeof tmpDir>;
  let key: ClientKey;
  let sshds: TestSshd[];
  let stop: () => Promise<void>;
  let echo: Server;
  let appPort = 0;
  beforeAll(async () => {
    tmp = tmpDir('dp-prompt-ack-');
    ({ key, sshds, stop } = await startSshdChain(tmp.dir, 2));
    appPort = await freePort();
    echo = await startEcho('app', { port: appPort });
  });
  afterAll(async () => {
    await stop?.();
    if (echo) await close(echo);
    tmp?.cleanup();
  });

  const get = async (client: Client): Promise<string> => {
    const ch = await forwardOut(client, '127.0.0.1', appPort, 5_000, systemClock);
    const chunks: Buffer[] = [];
    ch.on('data', (d: Buffer) => chunks.push(d));
    const ended = new Promise((r) => ch.once('close', r));
    ch.end('GET /x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n');
    await ended;
    return Buffer.concat(chunks).toString();
  };

  for (const hops of [1, 2]) {
    it(`is accepted by every hop (${hops} hop${hops > 1 ? 's' : ''}) and the tunnel keeps working`, async () => {
      const targets = sshds.slice(0, hops).map((s) => ({ host: '127.0.0.1', port: s.port, user: s.user, privateKey: key.privateKey }));
      const clients = await connectChain(targets, {
        clock: systemClock,
        hostKeys: new HostKeyBook(),
        connectTimeoutMs: 10_000,
        keepaliveIntervalMs: 0,
        keepaliveCountMax: 3,
      });
      let closed = false;
      for (const c of clients) c.once('close', () => (closed = true));
      try {
        const last = clients[clients.length - 1]!;
        expect(await get(last)).toMatch(/^HTTP\/1\.1 200/);
        for (const c of clients) {
          const send = ignoreSender(c);
          expect(send).not.toBeNull();
          for (let i = 0; i < 3; i++) send!();
        }
        // ackPromptly nudged after each reply above too; sshd would have disconnected on a bad packet.
        expect(await get(last)).toMatch(/^HTTP\/1\.1 200/);
        expect(closed).toBe(false);
      } finally {
        for (const c of clients.reverse()) c.end();
      }
    });
  }
});
