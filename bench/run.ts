// `npm run bench`: the performance table, printed and written to bench/results.json.
// Rows that need a daemon (Nginx, sshd) start it on 127.0.0.1 like the tests do.
// Each section runs in a process of its own: code shared between sections (the HTTP/1.1 client,
// the stores) is otherwise measured with the JIT and heap state an earlier section left behind
// (the in-server proxy rows moved by a third after the model API section in the same process).

import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import os from 'node:os';
import { join } from 'node:path';
import { balanceRows } from './balance.js';
import { churnRows } from './churn.js';
import { compatRows } from './compat.js';
import { gatewayRows } from './gateway.js';
import { modelRows } from './models.js';
import { removalRows } from './removals.js';
import { scaleRows } from './scale.js';
import { takeOverRows } from './takeover.js';
import { fleetRows } from './fleet.js';
import { serverProxyRows } from './server-proxy.js';
import { specRows } from './spec.js';
import { sshRows } from './ssh.js';
import { statsRows } from './stats.js';
import { storeRows } from './stores.js';
import { renderTable, wanted, type Row } from './table.js';

const SECTIONS: { name: string; run: () => Promise<Row[]> | Row[] }[] = [
  { name: 'spec', run: specRows },
  { name: 'gateway', run: gatewayRows },
  { name: 'churn', run: churnRows },
  { name: 'ssh', run: sshRows },
  { name: 'balance', run: balanceRows },
  { name: 'stats', run: () => statsRows() },
  { name: 'stores', run: storeRows },
  { name: 'models', run: modelRows },
  { name: 'server-proxy', run: serverProxyRows },
  { name: 'removals', run: removalRows },
  { name: 'takeover', run: takeOverRows },
  { name: 'fleet', run: fleetRows },
  { name: 'scale', run: scaleRows },
  { name: 'compat', run: compatRows },
];

const SECTION_FLAG = '--section';

const HELP = `npm run bench [-- <section>...]   the performance table, printed and written to bench/results.json

Sections (all when none is named; each runs in a Node process of its own):
  ${SECTIONS.map((s) => s.name).join(' ')}

Environment:
  DSTACK_PROXY_BENCH_ONLY=P5*,P6,P6b   only these rows (ids, comma-separated; a trailing * takes
                                       every id with that prefix); name the sections too, or the
                                       sections that do not check it run whole
  DSTACK_PROXY_BENCH_BEFORE=<dist>     P5/P5b/P5c also measure the tunnel process and P6/P6b the
                                       in-server proxy of another build (its dist/ directory, with
                                       node_modules next to it) in the same rounds, as "before"
  DSTACK_PROXY_BENCH_SCALE=converge|memory   one half of the scale section
  DSTACK_PROXY_BENCH_PG=<url>          the PostgreSQL of the stores section
`;

/** One section in a fresh Node process; its rows come back as JSON in a file (stdout is the section's own). */
async function runIsolated(name: string): Promise<Row[]> {
  const dir = mkdtempSync(join(os.tmpdir(), 'dp-bench-rows-'));
  try {
    const out = join(dir, 'rows.json');
    const child = promisify(execFile)(process.execPath, [fileURLToPath(import.meta.url), SECTION_FLAG, name, out], {
      maxBuffer: 64 * 1024 * 1024,
      timeout: 30 * 60_000,
    });
    child.child.stderr?.pipe(process.stderr);
    await child;
    return JSON.parse(readFileSync(out, 'utf8')) as Row[];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(HELP);
    return;
  }
  if (args[0] === SECTION_FLAG) {
    const section = SECTIONS.find((s) => s.name === args[1]);
    if (!section) throw new Error(`no bench section ${args[1]}`);
    writeFileSync(args[2] ?? '/dev/stdout', JSON.stringify(await section.run()));
    return;
  }
  const unknown = args.filter((a) => !SECTIONS.some((s) => s.name === a));
  if (unknown.length > 0)
    throw new Error(`unknown bench section(s): ${unknown.join(', ')}; known: ${SECTIONS.map((s) => s.name).join(' ')}`);
  const rows: Row[] = [];
  for (const section of SECTIONS) {
    if (args.length > 0 && !args.includes(section.name)) continue;
    process.stderr.write(`bench: ${section.name}…\n`);
    rows.push(...(await runIsolated(section.name)).filter((r) => wanted(r.id)));
  }
  const table = renderTable(rows);
  process.stdout.write(`${table}\n`);
  const notes = rows.filter((r) => r.note).map((r) => `${r.id}: ${r.note}`);
  if (notes.length > 0) process.stdout.write(`\n${notes.join('\n')}\n`);
  writeFileSync(
    'bench/results.json',
    `${JSON.stringify({ date: new Date().toISOString(), node: process.version, cpus: os.cpus().length, rows }, null, 2)}\n`,
  );
}

main().catch((err: unknown) => {
  process.stderr.write(`bench: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
