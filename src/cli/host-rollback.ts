// `dstack-proxy host rollback`: back to the other slot (the previous install), and back again
// when that one is not ready. See src/host/update.ts.

import { parseArgs } from 'node:util';
import { DEFAULT_ROOT } from '../host/layout.js';
import { rollbackHost } from '../host/update.js';
import type { Command } from './command.js';
import { UsageError } from './command.js';
import { readyTimeoutMs } from './host-update.js';

export const hostRollbackCommand: Command = {
  name: 'rollback',
  summary: 'switch to the other slot (the previous install), restart, and switch back if it is not ready',
  help: `Usage: dstack-proxy host rollback [--root DIR] [--ready-timeout SECONDS]

Make the slot that is not active the active one, restart the unit and wait for /readyz; when it
is not ready in time, switch back and restart. Refused when the other slot holds no package.
Exit codes: 0 rolled back; 1 nothing to roll back to; 3 not ready, switched back; 4 not ready
after switching back either.

Options:
  --root DIR               the host's root (default: ${DEFAULT_ROOT})
  --ready-timeout SECONDS  how long to wait for /readyz after a restart (default: 60)`,
  async run(argv, io) {
    const { values, positionals } = parseArgs({
      args: argv,
      options: { root: { type: 'string' }, 'ready-timeout': { type: 'string' } },
      allowPositionals: true,
      strict: true,
    });
    if (positionals.length > 0) throw new UsageError(`unexpected arguments: ${positionals.join(' ')}`);
    return rollbackHost(
      { root: values.root ?? DEFAULT_ROOT, readyTimeoutMs: readyTimeoutMs(values['ready-timeout']) },
      { out: (l) => io.stdout(`${l}\n`), err: (l) => io.stderr(`${l}\n`) },
    );
  },
};
