// The chain's own timers run on the injected clock: a channel that never opens is given up at
// its timeout (and a late one closed), and a client ended politely is destroyed after the grace.

import { describe, expect, it } from 'vitest';
import type { Client, ClientChannel } from 'ssh2';
import { END_GRACE_MS, endClient, forwardOut } from '../../../src/reconcilers/ssh/ssh-chain.js';
import { FakeClock } from '../../helpers/fake-clock.js';

/** A client whose forwardOut answers only when the test says so. */
function slowClient(): { client: Client; answer: (stream: Partial<ClientChannel>) => void } {
  let callback: ((err: Error | undefined, stream: ClientChannel) => void) | undefined;
  const client = {
    forwardOut(_a: string, _b: number, _h: string, _p: number, cb: (err: Error | undefined, stream: ClientChannel) => void) {
      callback = cb;
    },
  } as unknown as Client;
  return { client, answer: (stream) => callback!(undefined, stream as ClientChannel) };
}

describe('chain timers on the clock', () => {
  it('forwardOut gives up at its timeout and closes a channel that opens later', async () => {
    const clock = new FakeClock();
    const { client, answer } = slowClient();
    let settled: string | undefined;
    const p = forwardOut(client, '127.0.0.1', 8080, 5_000, clock).then(
      () => (settled = 'opened'),
      (err: Error) => (settled = err.message),
    );
    clock.advance(4_999);
    await Promise.resolve();
    expect(settled).toBeUndefined();
    clock.advance(1);
    await p;
    expect(settled).toBe('channel to 127.0.0.1:8080 did not open within 5000 ms');
    let closed = 0;
    answer({ close: () => void closed++ });
    expect(closed).toBe(1);
  });

  it('forwardOut clears its timer when the channel opens', async () => {
    const clock = new FakeClock();
    const { client, answer } = slowClient();
    const p = forwardOut(client, '127.0.0.1', 8080, 5_000, clock);
    expect(clock.pendingTimers()).toBe(1);
    answer({ destroy: () => undefined } as unknown as ClientChannel);
    await p;
    expect(clock.pendingTimers()).toBe(0);
  });

  it('endClient destroys the client once the grace has passed', () => {
    const clock = new FakeClock();
    const calls: string[] = [];
    const client = { end: () => calls.push('end'), destroy: () => calls.push('destroy') } as unknown as Client;
    endClient(client, clock);
    expect(calls).toEqual(['end']);
    clock.advance(END_GRACE_MS - 1);
    expect(calls).toEqual(['end']);
    clock.advance(1);
    expect(calls).toEqual(['end', 'destroy']);
  });
});
