// `dstack-proxy host rollback`: placeholder until the command lands.

import type { Command } from './command.js';

export const hostRollbackCommand: Command = {
  name: 'rollback',
  summary: 'not built yet',
  help: 'Usage: dstack-proxy host rollback',
  run(_argv, io) {
    io.stderr('dstack-proxy host rollback: not built yet\n');
    return Promise.resolve(1);
  },
};
