// The dstack compatibility layer as the gateway mounts it: the routes over the one compat write
// path, the status waits, and the refusal to serve them beyond loopback (they take no token:
// dstack's server sends none, and its SSH tunnel to 127.0.0.1 is the boundary).

import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../../clock.js';
import { listensOnLoopbackOnly } from '../../api/api-token.js';
import type { RouteModule } from '../../api/app.js';
import { ProxyError } from '../../errors.js';
import type { StateStore } from '../../state/store.js';
import { dstackRoutes, type DstackRoutesOptions } from './routes.js';
import { compatWriter } from './store-write.js';
import type { StatusSource } from './waits.js';

export { DSTACK_OWNER } from './calls.js';

export interface DstackCompatOptions {
  store: StateStore;
  status: StatusSource;
  logger: Logger;
  replicaWaitS: number;
  tls: 'wait' | 'async';
  certbotTimeoutS: number;
  /** The waits' bounds run on it. Default the system clock. */
  clock?: Clock;
  /** How a new domain becomes reachable (see DstackRoutesOptions.sites); absent, nothing waits for one. */
  sites?: DstackRoutesOptions['sites'];
}

/** The routes as one route module; their waits end when the app closes. */
export function dstackCompatRoutes(o: DstackCompatOptions): RouteModule {
  const logger = o.logger.child({ component: 'dstack-compat' });
  // The server registers one call at a time, so a cold sync of N services costs N × the call.
  // Validating the whole candidate would make each call linear in the document (about 0.1 s per
  // call at 1,000 services); the probe holds what the call wrote, and the mapper keeps every rule
  // that spans the document itself (its tests hold the two verdicts equal).
  const writer = compatWriter(o.store, logger, { validation: 'probe' });
  return async (app) => {
    const closing = new AbortController();
    // Before the server stops taking requests: fastify's close waits for those in flight, and a
    // waiting registration would hold it for its whole bound.
    app.addHook('preClose', async () => closing.abort());
    await dstackRoutes(app, {
      writer,
      read: () => o.store.read(),
      status: o.status,
      replicaWaitS: o.replicaWaitS,
      tls: o.tls,
      certbotTimeoutS: o.certbotTimeoutS,
      signal: closing.signal,
      clock: o.clock ?? systemClock,
      ...(o.sites ? { sites: o.sites } : {}),
      version: packageVersion(),
      logger,
    });
  };
}

/** Refuses a start that would serve the unauthenticated compat routes beyond loopback. */
export async function checkDstackCompatHost(apiHost: string): Promise<void> {
  if (await listensOnLoopbackOnly(apiHost)) return;
  throw new ProxyError(
    'DP_ERR_BAD_OPTION',
    `--dstack-compat true needs a loopback --api-host (got ${apiHost}): dstack's routes take no token, ` +
      `so on ${apiHost} anyone who can reach it could register services; dstack's server reaches 127.0.0.1 through its SSH tunnel`,
  );
}

let version: string | undefined;

/** Our package's version: the nearest package.json above this file (src/ under tests, dist/src/ when built). */
export function packageVersion(): string {
  if (version !== undefined) return version;
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'dstack-proxy' && typeof pkg.version === 'string') return (version = pkg.version);
    } catch {
      // not here: one level up
    }
    dir = dirname(dir);
  }
  return (version = '0.0.0');
}
