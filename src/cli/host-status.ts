// `dstack-proxy host status`: placeholder until the command lands.

import type { Command } from './command.js';

export const hostStatusCommand: Command = {
  name: 'status',
  summary: 'not built yet',
  help: 'Usage: dstack-proxy host status',
  run(_argv, io) {
    io.stderr('dstack-proxy host status: not built yet\n');
    return Promise.resolve(1);
  },
};
