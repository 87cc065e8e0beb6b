// `dstack-proxy host adopt`: placeholder until the command lands.

import type { Command } from './command.js';

export const hostAdoptCommand: Command = {
  name: 'adopt',
  summary: 'not built yet',
  help: 'Usage: dstack-proxy host adopt',
  run(_argv, io) {
    io.stderr('dstack-proxy host adopt: not built yet\n');
    return Promise.resolve(1);
  },
};
