// The gateway's route modules beyond the state API: the auth_request target Nginx calls, the
// autoscaler's stats, /metrics, and the OpenAI-compatible model API.

import type { Logger } from 'pino';
import { thisHostOnly } from '../api/api-token.js';
import { authRoutes } from '../api/auth-routes.js';
import { metricsRoutes } from '../api/metrics.js';
import { statsRoutes } from '../api/stats-routes.js';
import { createControlServerAuth, noServerAuth } from '../auth/index.js';
import type { RouteModule } from '../api/app.js';
import { byHostEligible } from '../reconcilers/ssh/host-routes.js';
import type { Clock } from '../clock.js';
import { dstackCompatRoutes } from '../compat/dstack/index.js';
import type { Controller } from '../reconcilers/controller.js';
import type { StateStore, StoredState } from '../state/store.js';
import { entrypointClient, nginxForwarder, registerModelApi, type FirstSeenStore } from '../models/index.js';
import type { StatsCollector } from '../stats/index.js';
import type { GatewayLoops } from './loops.js';
import { countDecisions, type CountedAuth } from '../auth/counted.js';
import { acmePeerRoutes, parseAcmePeers } from './acme-peers.js';
import type { SharedCertificates } from '../reconcilers/tls/shared.js';
import { gatewayMetrics } from './metrics-sources.js';
import type { GatewayHost } from './nginx-host.js';
import type { GatewayOptions } from './options.js';

/** The token check of every path: the control server's (cached), or none without --server-url. */
export function gatewayAuth(options: GatewayOptions, logger: Logger, clock: Clock | undefined): CountedAuth {
  if (!options.serverUrl) return countDecisions(noServerAuth);
  const auth = createControlServerAuth({
    serverUrl: options.serverUrl,
    ttlMs: options.authCacheTtl * 1000,
    timeoutMs: options.authTimeout * 1000,
    logger: logger.child({ component: 'auth' }),
    ...(clock ? { clock } : {}),
  });
  return countDecisions(auth);
}

/** What the routes need of the daemon being assembled. */
export interface RouteContext {
  logger: Logger;
  clock: Clock | undefined;
  controller: Controller;
  /** The store the API writes through (the dstack compatibility routes do too). */
  store: StateStore;
  current(): StoredState;
  /** Releases `cleanup` when the daemon closes. */
  defer(cleanup: () => unknown): void;
}

export function gatewayRoutes(
  d: RouteContext,
  options: GatewayOptions,
  {
    host,
    loops,
    stats,
    firstSeen,
    auth,
    writeFailures,
    shared,
  }: {
    host: GatewayHost;
    loops: GatewayLoops;
    stats: StatsCollector;
    firstSeen: FirstSeenStore;
    auth: CountedAuth;
    writeFailures: () => number;
    /** A fleet's certificate store: the challenges another gateway ordered are answered from it. */
    shared?: SharedCertificates;
  },
): RouteModule[] {
  const clock = d.clock ? { clock: d.clock } : {};
  // Model calls go through our own Nginx with the service's Host: load-balanced, rate-limited
  // per client and counted like any other request, on the internal listener (no auth_request
  // there: the model API checks the token itself).
  const modelForwarder = nginxForwarder({ socketPath: host.internal.socketPath });
  d.defer(() => modelForwarder.close());
  const metrics = gatewayMetrics(d.controller, d.current, stats, loops, { auth, writeFailures });
  const dstackCompat = options.dstackCompat === 'true';
  return [
    // Nginx calls the auth target for every request: never behind the API token, and for
    // this host only (an API beyond loopback must not be a token oracle for the network).
    async (a) =>
      a.register(async (scope) => {
        scope.addHook('onRequest', thisHostOnly);
        await scope.register(authRoutes, { auth });
        // The challenges this gateway's Nginx does not have: in the fleet's store, or asked of its peers.
        const peers = parseAcmePeers(options.acmeChallengePeers);
        if (peers.length > 0 || shared)
          await scope.register(acmePeerRoutes, { peers, ...(shared ? { stored: (t: string) => shared.challenge(t) } : {}) });
      }),
    // Stats and metrics list every project, service, replica and domain: management data. dstack's
    // server polls the stats without a token; with its routes on, the API is loopback-only.
    async (a, guard) =>
      a.register(statsRoutes, { collector: stats, getState: async () => d.current().state, ...(dstackCompat ? {} : { guard }) }),
    async (a, guard) => a.register(metricsRoutes, { metrics, guard }),
    // The OpenAI-compatible API; entrypoint sites proxy here. Always token-checked.
    async (a) =>
      registerModelApi(a, {
        prefix: '/api/models/:project',
        getState: () => d.current().state,
        authorize: (project, token) => auth.check(project, token),
        forward: (service, request) => modelForwarder.forward(service, request),
        // Behind an entrypoint site the client is who Nginx saw; called directly, the peer.
        clientOf: entrypointClient(host.internal.key),
        firstSeen,
        ...clock,
      }),
    // dstack's gateway API: off unless asked for, since it mutates the document without a token.
    ...(dstackCompat
      ? [
          dstackCompatRoutes({
            store: d.store,
            status: d.controller,
            logger: d.logger,
            replicaWaitS: options.dstackCompatReplicaWait,
            tls: options.dstackCompatTls,
            certbotTimeoutS: options.certbotTimeout,
            ...clock,
            sites: {
              // What our default server relays by Host is reachable once the data plane has it.
              byHost: (s) => options.defaultServer === 'true' && byHostEligible(s),
              hurry: (generation) => loops.nginx.hurry(generation),
            },
          }),
        ]
      : []),
  ];
}
