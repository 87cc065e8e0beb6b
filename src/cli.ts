#!/usr/bin/env node
// dstack-proxy: the command line. The dispatcher is src/cli/main.ts; each command is src/cli/<name>.ts.

import type { Io } from './cli/command.js';
import { main } from './cli/main.js';

const processIo: Io = {
  stdout: (s) => process.stdout.write(s),
  stderr: (s) => process.stderr.write(s),
  readStdin: async () => {
    const chunks: Buffer[] = [];
    for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks).toString('utf8');
  },
  isTTY: Boolean(process.stdout.isTTY),
  env: process.env,
};

main(process.argv.slice(2), processIo).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`dstack-proxy: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 1;
  },
);
