// `dstack-proxy host update <package-spec> [<version>]`: what <root>/update runs with the active
// slot's code, and what dstack's server runs through it. See src/host/update.ts.

import { parseArgs } from 'node:util';
import { DEFAULT_ROOT } from '../host/layout.js';
import { updateHost } from '../host/update.js';
import type { Command } from './command.js';
import { UsageError } from './command.js';

export function readyTimeoutMs(raw: string | undefined): number {
  if (raw === undefined) return 60_000;
  const seconds = Number(raw);
  if (!/^\d+(\.\d+)?$/.test(raw) || !(seconds > 0))
    throw new UsageError(`--ready-timeout must be a positive number of seconds; got ${JSON.stringify(raw)}`);
  return seconds * 1000;
}

export const hostUpdateCommand: Command = {
  name: 'update',
  summary: 'install a package into the unused slot, check it, switch, and roll back if it is not ready',
  help: `Usage: dstack-proxy host update [<package-spec> [<version>]] [--root DIR] [--ready-timeout SECONDS]

Install <package-spec> (dstack-proxy@0.2.0, a tarball path or URL) into the slot that is not
active, check it against the current config and state (its own "gateway --check"), switch the
version file to it, restart the unit and wait for /readyz. Not ready in time: switch back and
restart the previous slot.

With <version>: nothing is done when the active slot already has it, and a package of another
version is refused. Without it (an unversioned build) the package is always installed.
Without any argument (what an adopted host's dstack update.sh runs) the running slot stays and
the command says it is already installed.

Prints "Update successfully completed" only when the new slot serves.
Exit codes: 0 updated or already current; 1 refused or failed before switching (the running
slot untouched); 3 not ready after switching, rolled back; 4 not ready after the rollback either.

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
    const [spec = '', version = '', ...extra] = positionals;
    if (extra.length > 0) throw new UsageError(`unexpected arguments: ${extra.join(' ')}`);
    const timeout = readyTimeoutMs(values['ready-timeout']);
    return updateHost(
      { root: values.root ?? DEFAULT_ROOT, spec, version: version.trim(), readyTimeoutMs: timeout },
      { out: (l) => io.stdout(`${l}\n`), err: (l) => io.stderr(`${l}\n`) },
    );
  },
};
