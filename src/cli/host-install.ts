// `dstack-proxy host install`: placeholder until the command lands.

import type { Command } from './command.js';

export const hostInstallCommand: Command = {
  name: 'install',
  summary: 'not built yet',
  help: 'Usage: dstack-proxy host install',
  run(_argv, io) {
    io.stderr('dstack-proxy host install: not built yet\n');
    return Promise.resolve(1);
  },
};
