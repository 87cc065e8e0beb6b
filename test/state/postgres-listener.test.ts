// The LISTEN connection's reconnect backoff runs on the injected clock: pointed at a closed
// loopback port, every connect attempt fails at once, and only moving the clock brings the next.

import { describe, expect, it } from 'vitest';
import { PgListener } from '../../src/state/postgres-listener.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { freePort } from '../helpers/ports.js';
import { turns, turnsUntil } from './turns.js';

describe('PgListener', () => {
  it('retries a lost connection when its clock says so, with a doubling delay, and stop() leaves no timer', async () => {
    const port = await freePort(); // closed: nothing listens there
    const clock = new FakeClock();
    const lost: unknown[] = [];
    let connected = 0;
    const listener = new PgListener({
      config: { host: '127.0.0.1', port },
      channel: 'dp_test',
      onNotify: () => undefined,
      onConnected: () => connected++,
      onLost: (err) => lost.push(err),
      initialDelayMs: 1_000,
      maxDelayMs: 5_000,
      clock,
    });
    listener.start();
    await turnsUntil(() => lost.length === 1, 'the first connect attempt fails');
    expect(lost[0]).toMatchObject({ code: 'ECONNREFUSED' });
    expect(clock.pendingTimers()).toBe(1);
    // The delay is 1 s × a jitter of 0.8–1.2.
    const firstDelay = clock.nextDue()! - clock.now();
    expect(firstDelay).toBeGreaterThanOrEqual(800);
    expect(firstDelay).toBeLessThanOrEqual(1_200);

    clock.advance(799);
    await turns();
    expect(lost).toHaveLength(1);

    clock.advance(401);
    expect(clock.pendingTimers()).toBe(0); // the retry is under way
    await turnsUntil(() => lost.length === 2, 'the second connect attempt fails');
    expect(lost[1]).toMatchObject({ code: 'ECONNREFUSED' });
    const secondDelay = clock.nextDue()! - clock.now();
    expect(secondDelay).toBeGreaterThanOrEqual(1_600);
    expect(secondDelay).toBeLessThanOrEqual(2_400);

    await listener.stop();
    expect(clock.pendingTimers()).toBe(0);
    clock.advance(60_000);
    await turns();
    expect(lost).toHaveLength(2);
    expect(connected).toBe(0);
  });
});
