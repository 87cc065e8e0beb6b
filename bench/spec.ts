// Spec rows: parse + validate + normalise + hash of 10,000 services × 3 replicas, and diff.
// Time and peak memory are measured in a child process, so one row's garbage does not
// count against another's.

import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { diffSpecs, hashSpec, loadDocument, type ProxyState } from '../src/spec/index.js';
import { generateDocument } from './generate.js';
import { median, type Row } from './table.js';

const SERVICES = 10_000;
const REPLICAS = 3;

interface ChildResult {
  ms: number;
  maxRssMb: number;
  baseRssMb: number;
}

/** Runs in the child: load the document `runs` times, report the median and peak RSS. */
function childMain(format: 'json' | 'yaml'): void {
  const doc = generateDocument(SERVICES, REPLICAS);
  const text = format === 'json' ? JSON.stringify(doc) : stringify(doc);
  const baseRssMb = process.resourceUsage().maxRSS / 1024;
  const times: number[] = [];
  const runs = format === 'json' ? 5 : 1;
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    hashSpec(loadDocument(text, format));
    times.push(performance.now() - t);
  }
  const out: ChildResult = { ms: median(times), maxRssMb: process.resourceUsage().maxRSS / 1024, baseRssMb };
  process.stdout.write(JSON.stringify(out));
}

function inChild(format: 'json' | 'yaml'): ChildResult {
  const out = execFileSync(process.execPath, [fileURLToPath(import.meta.url), format], { encoding: 'utf8', maxBuffer: 1 << 20 });
  return JSON.parse(out) as ChildResult;
}

export function specRows(): Row[] {
  const rows: Row[] = [];
  const json = inChild('json');
  rows.push({
    id: 'S1',
    name: `load 10k services × 3 replicas (JSON): parse+validate+normalise+hash`,
    value: json.ms,
    unit: 'ms',
    target: '≤ 500 ms',
    ok: json.ms <= 500,
  });
  rows.push({
    id: 'S1m',
    name: 'peak RSS of that process (incl. the 4 MB text and its generator)',
    value: json.maxRssMb,
    unit: 'MB',
    target: '≤ 250 MB',
    ok: json.maxRssMb <= 250,
    note: `RSS before loading: ${json.baseRssMb.toFixed(0)} MB`,
  });
  const yaml = inChild('yaml');
  rows.push({
    id: 'S1y',
    name: 'load the same document as YAML (yaml 2 parser)',
    value: yaml.ms,
    unit: 'ms',
    note: 'no target; the control server sends JSON',
  });

  const doc = generateDocument(SERVICES, REPLICAS);
  const a: ProxyState = loadDocument(JSON.stringify(doc), 'json');
  const changed = structuredClone(doc);
  const replica = changed.spec.services![SERVICES / 2]!.replicas![1]!;
  replica.appPort = 9000;
  const b: ProxyState = loadDocument(JSON.stringify(changed), 'json');
  const times: number[] = [];
  for (let i = 0; i < 21; i++) {
    const t = performance.now();
    diffSpecs(a, b);
    times.push(performance.now() - t);
  }
  const d = median(times);
  rows.push({
    id: 'S2',
    name: 'diff of two 10k-service documents differing in one replica (median of 21)',
    value: d,
    unit: 'ms',
    target: '≤ 50 ms',
    ok: d <= 50,
  });
  return rows;
}

if (process.argv[1] === fileURLToPath(import.meta.url) && (process.argv[2] === 'json' || process.argv[2] === 'yaml')) {
  childMain(process.argv[2]);
}
