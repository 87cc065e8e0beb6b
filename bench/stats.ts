// P7: access-log parsing throughput on a generated 5-million-line log, and `collect` latency
// with 1,000 hosts. bench/run.ts: `{ name: 'stats', run: statsRows }`; `node dist/bench/stats.js`
// runs it alone.

import { closeSync, mkdtempSync, openSync, rmSync, statSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createStatsCollector } from '../src/stats/index.js';
import { API_VERSION, KIND, type ProxyState } from '../src/spec/types.js';
import { median, type Row } from './table.js';

export interface StatsBenchOptions {
  lines?: number;
  hosts?: number;
  /** collect() repetitions; the median is reported. */
  collectRuns?: number;
}

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, '+00:00');

/** Write `lines` log lines over `hosts` hosts, spread over the last 300 s; returns bytes written. */
export function generateAccessLog(path: string, lines: number, hosts: number, nowMs = Date.now()): number {
  const fd = openSync(path, 'w');
  let bytes = 0;
  try {
    const stamps = Array.from({ length: 300 }, (_, i) => iso(nowMs - (299 - i) * 1000));
    const statuses = ['200', '200', '200', '201', '401', '429', '502'];
    // Every (host, status) pair once: the rest of a line after its timestamp.
    const period = hosts * statuses.length;
    const rests = Array.from({ length: period }, (_, i) => {
      const status = statuses[i % statuses.length]!;
      const hit = status === '401' || status === '429' ? 0 : 1;
      return ` run-${i % hosts}.gw.example.com ${status} ${(((i * 7919) % 5000) / 1000).toFixed(3)} ${hit}\n`;
    });
    const perSecond = Math.ceil(lines / 300);
    let chunk: string[] = [];
    for (let i = 0; i < lines; i++) {
      chunk.push(stamps[Math.min(299, Math.floor(i / perSecond))]! + rests[i % period]!);
      if (chunk.length === 50_000) {
        bytes += writeSync(fd, chunk.join(''));
        chunk = [];
      }
    }
    if (chunk.length > 0) bytes += writeSync(fd, chunk.join(''));
  } finally {
    closeSync(fd);
  }
  return bytes;
}

function stateWith(hosts: number): ProxyState {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.test/dir' },
      projects: [{ name: 'main' }],
      services: Array.from({ length: hosts }, (_, i) => ({
        project: 'main',
        run: `run-${i}`,
        domain: `run-${i}.gw.example.com`,
        https: false,
        auth: false,
        clientMaxBodySize: 64 * 1024 * 1024,
        stripPrefix: true,
        rateLimits: [],
        replicas: [],
      })),
      entrypoints: [],
    },
  };
}

export async function statsRows(o: StatsBenchOptions = {}): Promise<Row[]> {
  const lines = o.lines ?? 5_000_000;
  const hosts = o.hosts ?? 1_000;
  const dir = mkdtempSync(join(tmpdir(), 'dp-bench-stats-'));
  try {
    const log = join(dir, 'access.log');
    generateAccessLog(log, lines, hosts);
    const size = statSync(log).size;
    const sc = createStatsCollector({ accessLogPath: log, startAt: 'start' });
    const t0 = process.hrtime.bigint();
    await sc.poll();
    const parseSec = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = sc.counters();
    if (c.lines !== lines) throw new Error(`parsed ${c.lines} lines of ${lines}`);

    const state = stateWith(hosts);
    const snapshots: number[] = [];
    const collects: number[] = [];
    for (let i = 0; i < (o.collectRuns ?? 51); i++) {
      let t = process.hrtime.bigint();
      const out = sc.snapshot(state);
      snapshots.push(Number(process.hrtime.bigint() - t) / 1e6);
      if (out.length !== hosts) throw new Error('snapshot lost services');
      t = process.hrtime.bigint();
      await sc.collect(state);
      collects.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    await sc.stop();
    const perSec = Math.round(lines / parseSec);
    const collectMs = Number(median(collects).toFixed(3));
    const windowsMs = Number(median(snapshots).toFixed(3));
    return [
      {
        id: 'P7',
        name: `access-log lines parsed per second (${(lines / 1e6).toFixed(0)} M generated lines, ${(size / 2 ** 20).toFixed(0)} MiB, read from disk)`,
        value: perSec,
        unit: 'lines/s',
        target: '≥ 2,000,000',
        ok: perSec >= 2_000_000,
        better: 'higher',
      },
      {
        id: 'P7c',
        name: `collect latency with ${hosts} hosts (median of ${collects.length}; log poll + windows)`,
        value: collectMs,
        unit: 'ms',
        target: '≤ 10 ms',
        ok: collectMs <= 10,
        better: 'lower',
        note: `windows alone ${windowsMs} ms`,
      },
    ];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await statsRows();
  process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
}
