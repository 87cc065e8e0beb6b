// The access-log parser and the frames, on bytes made here.

import { describe, expect, it } from 'vitest';
import { FrameTable, HostFrames } from '../../src/stats/frames.js';
import { daysFromCivil, newParseCounters, parseIsoSeconds, parseLines } from '../../src/stats/parse.js';

const T0 = '2025-01-01T12:00:00+00:00';
const sec = (iso: string) => Date.parse(iso) / 1000;

function parse(text: string) {
  const table = new FrameTable();
  const c = newParseCounters();
  const b = Buffer.from(text, 'latin1');
  const rest = parseLines(b, 0, b.length, table, c);
  return { table, c, rest, b };
}

describe('parseIsoSeconds', () => {
  it.each([
    ['2025-01-01T12:00:00+00:00'],
    ['1999-12-31T23:59:59+00:00'],
    ['2024-02-29T00:00:01+05:30'],
    ['2038-06-15T08:09:10-07:00'],
    ['2100-03-01T00:00:00+14:00'],
  ])('%s matches Date.parse', (iso) => {
    expect(parseIsoSeconds(Buffer.from(iso), 0)).toBe(sec(iso));
  });

  it.each([['2025-01-01 12:00:00+00:00'], ['2025-13-01T12:00:00+00:00'], ['2025-01-01T12:00:00Z00:00'], ['2025-0a-01T12:00:00+00:00']])(
    'rejects %s',
    (iso) => expect(parseIsoSeconds(Buffer.from(iso), 0)).toBe(-1),
  );

  it('daysFromCivil agrees with Date.UTC over four centuries of first days', () => {
    for (let y = 1900; y < 2300; y += 7) {
      for (const m of [1, 2, 3, 12]) expect(daysFromCivil(y, m, 1)).toBe(Date.UTC(y, m - 1, 1) / 86_400_000);
    }
  });
});

describe('parseLines', () => {
  it('counts replica hits per host with request time in ms, skips 0 and -', () => {
    const { table, c, rest, b } = parse(
      [
        `${T0} a.test 200 0.153 1`,
        `${T0} a.test 200 1.5 1`,
        `${T0} a.test 401 0.001 0`,
        `${T0} b.test 301 0.000 -`,
        `${T0} b.test 502 12 1`,
        '',
      ].join('\n'),
    );
    expect(rest).toBe(b.length);
    expect(c).toEqual({ lines: 5, malformed: 0, hits: 3 });
    const a = table.get('a.test')!;
    expect([a.totalRequests, a.totalTimeMs]).toEqual([2, 1653]);
    expect(table.get('b.test')!.totalTimeMs).toBe(12_000);
  });

  it.each([
    ['garbage'],
    [''],
    [`${T0} a.test 200 0.153`],
    [`${T0} a.test 200 0.153 1 extra`],
    [`${T0}  200 0.153 1`],
    [`${T0} a.test 20 0.153 1`],
    [`${T0} a.test 200 x 1`],
    [`${T0} a.test 200 0. 1`],
    [`${T0} a.test 200 0.153 2`],
    ['2025-01-01T12:00:00 a.test 200 0.153 1'],
  ])('skips and counts a malformed line: %j', (line) => {
    const { c, table } = parse(`${line}\n${T0} ok.test 200 0.100 1\n`);
    expect(c).toEqual({ lines: 2, malformed: 1, hits: 1 });
    expect(table.get('ok.test')!.totalRequests).toBe(1);
  });

  it('leaves a half-written last line for the next chunk', () => {
    const full = `${T0} a.test 200 0.153 1\n`;
    for (let cut = 0; cut < full.length; cut++) {
      const { c, rest } = parse(`${full}${full.slice(0, cut)}`);
      expect(c.lines, `cut ${cut}`).toBe(1);
      expect(rest, `cut ${cut}`).toBe(full.length);
    }
  });

  it('never reads past `end` (stale bytes of a reused buffer)', () => {
    const full = `${T0} a.test 200 0.153 1\n`;
    const b = Buffer.from(full + full);
    for (let end = full.length; end < b.length; end++) {
      const table = new FrameTable();
      const c = newParseCounters();
      expect(parseLines(b, 0, end, table, c)).toBe(full.length);
      expect(c.lines).toBe(1);
    }
  });
});

describe('status classes', () => {
  it('counts replica hits by the first digit of their status; misses are not counted', () => {
    const { table, c } = parse(
      [
        `${T0} a.test 200 0.010 1`,
        `${T0} a.test 201 0.010 1`,
        `${T0} a.test 404 0.010 1`,
        `${T0} a.test 502 0.010 1`,
        `${T0} a.test 401 0.000 0`,
        `${T0} a.test 999 0.010 1`,
        '',
      ].join('\n'),
    );
    expect(c.malformed).toBe(0);
    expect([...table.get('a.test')!.byClass]).toEqual([1, 0, 2, 0, 1, 1]);
  });
});

describe('frames', () => {
  it('windows of 30/60/300 s with the mean request time', () => {
    const h = new HostFrames('a.test', 1);
    const now = 1_700_000_000;
    h.add(now, 100); // age 0
    h.add(now - 29, 300); // age 29: every window
    h.add(now - 30, 1000); // 60 and 300
    h.add(now - 299, 5000); // 300 only
    h.add(now - 300, 9000); // too old for every window
    const w = h.windows(now);
    expect(w['30']).toEqual({ requests: 2, request_time: 0.2 });
    // (100 + 300 + 1000) / 3 ms = 0.4666… s, reported to the millisecond as dstack's gateway does.
    expect(w['60']).toEqual({ requests: 3, request_time: 0.467 });
    expect(w['300'].requests).toBe(4);
    expect(w['300'].request_time).toBeCloseTo((100 + 300 + 1000 + 5000) / 4 / 1000);
    // A later second reuses the ring slot of `now - 300`: the old frame is gone.
    h.add(now + 1, 0);
    expect(h.windows(now + 1)['300'].requests).toBe(4);
    // A line older than what a slot holds does not overwrite it.
    h.add(now + 1 - 300, 7);
    expect(h.windows(now + 1)['30'].requests).toBe(2);
  });

  it('prunes idle hosts that left the document, keeps the rest; caps the number of hosts', () => {
    const t = new FrameTable(2);
    t.add('a', 100, 1);
    t.add('b', 100, 1);
    t.add('c', 100, 1);
    expect([t.size, t.dropped]).toEqual([2, 1]);
    t.prune(new Set(['a']), 100 + 299);
    expect(t.size).toBe(2);
    t.prune(new Set(['a']), 100 + 300);
    expect([...t.hosts()].map((h) => h.name)).toEqual(['a']);
    t.add('c', 500, 1);
    expect(t.get('c')?.totalRequests).toBe(1);
  });

  it('answers the services a key names, in order, zeros when idle, and prunes the other keys', () => {
    const t = new FrameTable();
    const T = sec(T0);
    t.add('a.test', T, 200);
    t.add('gone.test', T, 1);
    const services = [
      { project: 'p', run: 'a', domain: 'a.test' },
      { project: 'p', run: 'nodomain', domain: '' },
      { project: 'p', run: 'b', domain: 'b.test' },
    ];
    const keyOf = (s: (typeof services)[number]) => s.domain || undefined;
    const now = t.serviceStats(services, keyOf, T);
    expect(now.map((e) => [e.project_name, e.run_name])).toEqual([
      ['p', 'a'],
      ['p', 'b'],
    ]);
    expect(now[0]!.stats['30']).toEqual({ requests: 1, request_time: 0.2 });
    expect(now[1]!.stats['300']).toEqual({ requests: 0, request_time: 0 });
    expect(t.size).toBe(2); // gone.test still has frames inside the windows
    const later = t.serviceStats(services, keyOf, T + 300);
    expect(later[0]!.stats['300'].requests).toBe(0);
    expect([...t.hosts()].map((h) => h.name)).toEqual(['a.test']);
  });
});
