// `dstack-proxy host status`: the active slot and its version, the previous one, the runtime,
// the unit's state and the gateway's /readyz answer.

import { parseArgs } from 'node:util';
import { formatHostStatus, hostStatus } from '../host/status.js';
import { DEFAULT_ROOT } from '../host/layout.js';
import type { Command } from './command.js';
import { EXIT_USAGE, UsageError, type Io } from './command.js';

export const hostStatusCommand: Command = {
  name: 'status',
  summary: "show the active slot, its version and runtime, the previous slot, the unit's state and /readyz",
  help: `Usage: dstack-proxy host status [--root DIR] [--json]

Show what the gateway host runs: the active slot (its version, package, Node runtime and
install time), the other slot (the previous install, or empty), the unit and whether it is
active, and the gateway's /readyz answer.

Options:
  --root DIR   the host root (default ${DEFAULT_ROOT})
  --json       print the status as one JSON object

Exit codes: 0 the status was read (whatever it says), 1 the root is not a gateway host (no
version file), 2 usage error.`,
  async run(argv, io) {
    try {
      return await runStatus(argv, io);
    } catch (err) {
      return fail(err, io, 'status', hostStatusCommand.help);
    }
  },
};

async function runStatus(argv: string[], io: Io): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    strict: true,
    allowPositionals: true,
    options: { root: { type: 'string', default: DEFAULT_ROOT }, json: { type: 'boolean', default: false } },
  });
  if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0]}"`);
  const status = await hostStatus(values.root);
  io.stdout(values.json ? `${JSON.stringify(status, null, 2)}\n` : formatHostStatus(status));
  return 0;
}

/** Errors name this verb, and a usage error shows this verb's help (not the host command's). */
function fail(err: unknown, io: Io, verb: string, help: string): number {
  const message = (err as Error).message;
  if (err instanceof UsageError || (err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
    io.stderr(`dstack-proxy host ${verb}: ${message}\n\n${help}\n`);
    return EXIT_USAGE;
  }
  io.stderr(`dstack-proxy host ${verb}: ${message}\n`);
  return 1;
}
