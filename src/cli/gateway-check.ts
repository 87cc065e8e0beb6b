// `dstack-proxy gateway --check`: what a host update runs with the NEW slot's code before it
// switches to it. The options are resolved exactly as the daemon resolves them, the API token
// file is read as the daemon reads it, and the stored document is read (never written, no
// directory created) and validated as the daemon's store does on start: a build that cannot
// run on today's config and state is refused while the old one still serves.

import { join, resolve } from 'node:path';
import { pino } from 'pino';
import { readApiToken } from '../api/api-token.js';
import type { GatewayOptions } from '../gateway/options.js';
import { STATE_FILE, loadStateFile } from '../state/file-store.js';
import { parseStoreUrl, redactStoreUrl } from '../state/open-store.js';
import type { Io } from './command.js';

export async function checkGatewayConfig(options: GatewayOptions, io: Io): Promise<number> {
  if (options.apiTokenFile) await readApiToken(options.apiTokenFile, pino({ level: 'silent' }));
  if (options.db !== undefined) {
    // Reading the database could create its table: --check writes nothing anywhere.
    parseStoreUrl(options.db);
    io.stdout(`config is valid; the document is kept in ${redactStoreUrl(options.db)}, not read by --check\n`);
    return 0;
  }
  // The daemon resolves a relative state dir against its working directory too.
  const stored = await loadStateFile(join(resolve(options.stateDir), STATE_FILE));
  io.stdout(`config and state are valid (generation ${stored.generation})\n`);
  return 0;
}
