// `dstack-proxy host install`: run by host/dstack-proxy-install once the runtime and the
// package are in a slot; writes the host's files and unit, starts the gateway and waits for it.

import { parseArgs } from 'node:util';
import { resolve } from 'node:path';
import { installHost } from '../host/install.js';
import { DEFAULT_ROOT, DEFAULT_UNIT_NAME, type Slot } from '../host/layout.js';
import type { Command } from './command.js';
import { EXIT_USAGE, UsageError, type Io } from './command.js';

const HELP = `Usage: dstack-proxy host install --slot blue|green --package SPEC --runtime VERSION [options]

Make this host run the package installed in a slot as a systemd service, idempotently: write
config.yaml (from --config, else keep the host's, else a default for the system Nginx),
host.json, the slot's slot.json, the version file (only when missing), the start and update
scripts and the unit; patch the system nginx.conf (nginx: system); start the unit, or restart
it when what it runs changed; wait until the gateway answers /readyz. Files are written only
when their content differs; a run that changes nothing says "nothing to do".

Normally run by host/dstack-proxy-install after it installed the runtime and the package.

Options:
  --root DIR            the host root (default ${DEFAULT_ROOT})
  --slot blue|green     the slot holding the package
  --package SPEC        what the slot was installed from (recorded in slot.json)
  --runtime VERSION     the Node version of the slot's runtime (recorded in slot.json)
  --runtime-from URL    the registry the runtime came from (recorded in host.json)
  --config FILE         the gateway config to install as <root>/config.yaml
  --unit-name NAME      systemd unit name without .service (default ${DEFAULT_UNIT_NAME})
  --unit-dir DIR        where the unit file goes (default /etc/systemd/system)
  --systemctl "ARGV"    the systemctl program and its leading arguments, split on spaces
                        (default systemctl; a daemonless replacement works too)
  --ready-timeout SEC   seconds to wait for /readyz (default 60)

Exit codes: 0 ready (or nothing to do), 1 failed or not ready (one line: why, and where the
logs are), 2 usage error.`;

export const hostInstallCommand: Command = {
  name: 'install',
  summary: 'write the unit, scripts and config for a slot, start it and wait for /readyz',
  help: HELP,
  async run(argv, io) {
    try {
      return await runInstall(argv, io);
    } catch (err) {
      return fail(err, io, 'install', HELP);
    }
  },
};

async function runInstall(argv: string[], io: Io): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    strict: true,
    allowPositionals: true,
    options: {
      root: { type: 'string', default: DEFAULT_ROOT },
      slot: { type: 'string' },
      package: { type: 'string' },
      runtime: { type: 'string' },
      'runtime-from': { type: 'string' },
      config: { type: 'string' },
      'unit-name': { type: 'string', default: DEFAULT_UNIT_NAME },
      'unit-dir': { type: 'string', default: '/etc/systemd/system' },
      systemctl: { type: 'string', default: 'systemctl' },
      'ready-timeout': { type: 'string', default: '60' },
    },
  });
  if (positionals.length > 0) throw new UsageError(`unexpected argument "${positionals[0]}"`);
  const slot = values.slot;
  if (slot !== 'blue' && slot !== 'green') throw new UsageError('--slot must be blue or green');
  if (!values.package) throw new UsageError('--package is required');
  if (!values.runtime) throw new UsageError('--runtime is required');
  const timeout = Number(values['ready-timeout']);
  if (!Number.isFinite(timeout) || timeout <= 0) throw new UsageError('--ready-timeout must be a positive number of seconds');
  const systemctlArgv = values.systemctl.split(' ').filter(Boolean);
  if (systemctlArgv.length === 0) throw new UsageError('--systemctl is empty');

  const report = await installHost({
    root: values.root,
    slot: slot as Slot,
    package: values.package,
    runtime: values.runtime,
    ...(values['runtime-from'] ? { runtimeFrom: values['runtime-from'] } : {}),
    ...(values.config !== undefined ? { configFile: resolve(values.config) } : {}),
    unitName: values['unit-name'],
    unitDir: values['unit-dir'],
    systemctl: systemctlArgv,
    readyTimeoutMs: timeout * 1000,
    log: (line) => io.stderr(`dstack-proxy host install: ${line}\n`),
  });
  const summary = `dstack-proxy ${report.version} (${report.active}) is ready at ${report.url}`;
  if (report.nothingToDo) {
    io.stdout(`nothing to do: ${summary}\n`);
    return 0;
  }
  const lines = Object.entries(report.files).map(([file, outcome]) => `${outcome.padEnd(9)} ${file}`);
  for (const edit of report.nginxEdits) lines.push(`nginx.conf: ${edit}`);
  if (report.actions.length > 0) lines.push(`systemctl: ${report.actions.join(', ')} ${report.unit}`);
  io.stdout(`${lines.join('\n')}\n${summary}\n`);
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
