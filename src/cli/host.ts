// `dstack-proxy host <verb>`: installing, updating and inspecting a gateway host. The POSIX
// shell script host/dstack-proxy-install bootstraps a bare machine (distribution packages, the
// pinned Node runtime, the first package) and hands over to `host install`; everything after
// that runs here, with the installed package's own code.

import type { Command } from './command.js';
import { EXIT_USAGE } from './command.js';
import { hostAdoptCommand } from './host-adopt.js';
import { hostInstallCommand } from './host-install.js';
import { hostRollbackCommand } from './host-rollback.js';
import { hostStatusCommand } from './host-status.js';
import { hostUpdateCommand } from './host-update.js';

const VERBS: Command[] = [hostInstallCommand, hostUpdateCommand, hostRollbackCommand, hostStatusCommand, hostAdoptCommand];

function usage(): string {
  const width = Math.max(...VERBS.map((c) => c.name.length));
  return `Usage: dstack-proxy host <verb> [options]

Verbs:
${VERBS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`).join('\n')}

Run "dstack-proxy host <verb> --help" for a verb's options.`;
}

export const hostCommand: Command = {
  name: 'host',
  summary: 'install, update, roll back and inspect a gateway host (blue/green slots)',
  help: usage(),
  ownHelp: true,
  async run(argv, io) {
    const [verb, ...rest] = argv;
    if (!verb || verb === '--help' || verb === '-h') {
      io.stdout(`${usage()}\n`);
      return verb ? 0 : EXIT_USAGE;
    }
    const command = VERBS.find((c) => c.name === verb);
    if (!command) {
      io.stderr(`dstack-proxy host: unknown verb "${verb}"\n\n${usage()}\n`);
      return EXIT_USAGE;
    }
    if (rest.includes('--help') || rest.includes('-h')) {
      io.stdout(`${command.help}\n`);
      return 0;
    }
    return command.run(rest, io);
  },
};
