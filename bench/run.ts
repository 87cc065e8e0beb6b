// `npm run bench`: the performance table, printed and written to bench/results.json.
// Rows that need a daemon (Nginx, sshd) start it on 127.0.0.1 like the tests do.

import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { gatewayRows } from './gateway.js';
import { modelRows } from './models.js';
import { serverProxyRows } from './server-proxy.js';
import { specRows } from './spec.js';
import { sshRows } from './ssh.js';
import { statsRows } from './stats.js';
import { storeRows } from './stores.js';
import { renderTable, type Row } from './table.js';

const SECTIONS: { name: string; run: () => Promise<Row[]> | Row[] }[] = [
  { name: 'spec', run: specRows },
  { name: 'gateway', run: gatewayRows },
  { name: 'ssh', run: sshRows },
  { name: 'stats', run: () => statsRows() },
  { name: 'stores', run: storeRows },
  { name: 'models', run: modelRows },
  { name: 'server-proxy', run: serverProxyRows },
];

async function main(): Promise<void> {
  const only = process.argv.slice(2);
  const rows: Row[] = [];
  for (const section of SECTIONS) {
    if (only.length > 0 && !only.includes(section.name)) continue;
    process.stderr.write(`bench: ${section.name}…\n`);
    rows.push(...(await section.run()));
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
