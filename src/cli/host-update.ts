// `dstack-proxy host update`: placeholder until the command lands.

import type { Command } from './command.js';

export const hostUpdateCommand: Command = {
  name: 'update',
  summary: 'not built yet',
  help: 'Usage: dstack-proxy host update',
  run(_argv, io) {
    io.stderr('dstack-proxy host update: not built yet\n');
    return Promise.resolve(1);
  },
};
