// The collector over a plain file: appends, half lines, rotation, truncation, overlong lines.

import { appendFile, rename, truncate, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FakeClock } from '../helpers/fake-clock.js';
import { createStatsCollector, type StatsCollector } from '../../src/stats/index.js';
import { API_VERSION, KIND, type ProxyState } from '../../src/spec/types.js';
import { tmpDir } from '../helpers/tmp.js';

const NOW = Date.UTC(2025, 0, 1, 12, 0, 0);
const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, '+00:00');
const line = (host: string, ms = NOW, hit = 1, t = '0.100') => `${iso(ms)} ${host} 200 ${t} ${hit}\n`;
const lines = (n: number, host = 'a.test') => line(host).repeat(n);

const state: ProxyState = {
  apiVersion: API_VERSION,
  kind: KIND,
  spec: {
    acme: { server: 'https://acme.test/dir' },
    projects: [{ name: 'main' }],
    services: [
      {
        project: 'main',
        run: 'a',
        domain: 'a.test',
        https: false,
        auth: false,
        clientMaxBodySize: 1,
        stripPrefix: true,
        rateLimits: [],
        replicas: [],
      },
      {
        project: 'main',
        run: 'idle',
        domain: 'idle.test',
        https: false,
        auth: false,
        clientMaxBodySize: 1,
        stripPrefix: true,
        rateLimits: [],
        replicas: [],
      },
      {
        project: 'main',
        run: 'internal',
        https: false,
        auth: false,
        clientMaxBodySize: 1,
        stripPrefix: true,
        rateLimits: [],
        replicas: [],
      },
    ],
    entrypoints: [],
  },
};

let tmp: ReturnType<typeof tmpDir>;
let log: string;
let clock: FakeClock;
let sc: StatsCollector;

async function requests30(): Promise<number> {
  const out = await sc.collect(state);
  return out.find((s) => s.run_name === 'a')!.stats['30'].requests;
}

beforeEach(async () => {
  tmp = tmpDir('dp-stats-');
  log = join(tmp.dir, 'access.log');
  clock = new FakeClock(NOW);
  sc = createStatsCollector({ accessLogPath: log, clock, rotateGraceMs: 5_000, chunkBytes: 256 });
});
afterEach(async () => {
  await sc.stop();
  tmp.cleanup();
});

describe('stats collector on a file', () => {
  it('answers every service with a domain in dstack format, zeros when idle', async () => {
    await writeFile(log, '');
    await sc.poll();
    await appendFile(log, lines(3) + line('a.test', NOW - 45_000, 1, '0.500') + line('a.test', NOW, 0));
    expect(await sc.collect(state)).toEqual([
      {
        project_name: 'main',
        run_name: 'a',
        stats: {
          '30': { requests: 3, request_time: 0.1 },
          '60': { requests: 4, request_time: 0.2 },
          '300': { requests: 4, request_time: 0.2 },
        },
      },
      {
        project_name: 'main',
        run_name: 'idle',
        stats: { '30': { requests: 0, request_time: 0 }, '60': { requests: 0, request_time: 0 }, '300': { requests: 0, request_time: 0 } },
      },
    ]);
    clock.advance(31_000);
    expect(await requests30()).toBe(0);
  });

  it('starts at the end of a log that already exists; reads a log created later from its start', async () => {
    await writeFile(log, lines(5));
    await sc.poll();
    expect(await requests30()).toBe(0);
    await appendFile(log, lines(2));
    expect(await requests30()).toBe(2);

    const late = createStatsCollector({ accessLogPath: join(tmp.dir, 'late.log'), clock });
    await late.poll();
    await writeFile(join(tmp.dir, 'late.log'), lines(4));
    expect((await late.collect(state))[0]!.stats['30'].requests).toBe(4);
    await late.stop();
  });

  it('keeps a half-written line until its newline arrives (across many small chunks)', async () => {
    await writeFile(log, '');
    await sc.poll();
    const l = line('a.test');
    await appendFile(log, lines(40) + l.slice(0, 20));
    expect(await requests30()).toBe(40);
    await appendFile(log, l.slice(20));
    expect(await requests30()).toBe(41);
    expect(sc.counters().skipped).toBe(0);
  });

  it('follows a rename + reopen: drains the old file, reads the new one, loses and doubles nothing', async () => {
    await writeFile(log, '');
    await sc.poll();
    await appendFile(log, lines(3));
    expect(await requests30()).toBe(3);
    await rename(log, `${log}.1`);
    await appendFile(`${log}.1`, lines(2)); // written before the reopen
    expect(await requests30()).toBe(5);
    await writeFile(log, lines(4)); // the reopen creates a new file
    await appendFile(`${log}.1`, lines(1)); // a worker that had not reopened yet
    expect(await requests30()).toBe(10);
    expect(sc.counters().rotations).toBe(1);
    clock.advance(5_000); // grace over: drained once more, then closed
    await sc.poll();
    await appendFile(`${log}.1`, lines(1));
    await appendFile(log, lines(1));
    expect(await requests30()).toBe(11);
  });

  it('starts over after a truncation (copytruncate)', async () => {
    await writeFile(log, '');
    await sc.poll();
    await appendFile(log, lines(6));
    expect(await requests30()).toBe(6);
    await truncate(log, 0);
    await appendFile(log, lines(2));
    expect(await requests30()).toBe(8);
    expect(sc.counters().truncations).toBe(1);
  });

  it('skips and counts malformed and overlong lines without losing the good ones', async () => {
    await writeFile(log, '');
    await sc.poll();
    await appendFile(log, `${lines(2)}this is not a log line\n${'x'.repeat(40_000)}\n${lines(3)}`);
    expect(await requests30()).toBe(5);
    expect(sc.counters()).toMatchObject({ malformed: 1, dropped: 1, skipped: 2, hits: 5 });
  });

  it('polls in the background once started', async () => {
    await writeFile(log, '');
    sc.start();
    await sc.poll();
    await appendFile(log, lines(2));
    clock.advance(1_000);
    await sc.poll(); // waits for the background poll that the timer started
    expect(sc.snapshot(state)[0]!.stats['30'].requests).toBe(2);
  });
});
