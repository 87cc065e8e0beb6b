// The command dispatcher, apart from process I/O so tests call it directly.

import type { Command, Io } from './command.js';
import { EXIT_USAGE, UsageError } from './command.js';
import { applyCommand } from './apply.js';
import { gatewayCommand } from './gateway.js';
import { hostCommand } from './host.js';
import { planCommand } from './plan.js';
import { serverProxyCommand } from './server-proxy.js';
import { statusCommand } from './status.js';
import { validateCommand } from './validate.js';

const COMMANDS: Command[] = [gatewayCommand, serverProxyCommand, validateCommand, planCommand, applyCommand, statusCommand, hostCommand];

function usage(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  return `Usage: dstack-proxy <command> [options]

Commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n')}

Run "dstack-proxy <command> --help" for a command's options.
`;
}

export async function main(argv: string[], io: Io): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    io.stdout(usage());
    return name ? 0 : EXIT_USAGE;
  }
  const command = COMMANDS.find((c) => c.name === name);
  if (!command) {
    io.stderr(`dstack-proxy: unknown command "${name}"\n\n${usage()}`);
    return EXIT_USAGE;
  }
  if (!command.ownHelp && (rest.includes('--help') || rest.includes('-h'))) {
    io.stdout(`${command.help}\n`);
    return 0;
  }
  try {
    return await command.run(rest, io);
  } catch (err) {
    if (err instanceof UsageError || (err as NodeJS.ErrnoException).code?.startsWith('ERR_PARSE_ARGS')) {
      io.stderr(`dstack-proxy ${name}: ${(err as Error).message}\n\n${command.help}\n`);
      return EXIT_USAGE;
    }
    io.stderr(`dstack-proxy ${name}: ${(err as Error).message}\n`);
    return 1;
  }
}
