// The gateway daemon: state.json (watched), the SSH, TLS and Nginx loops over a private or the
// system Nginx, and the API with the auth_request target, stats, metrics and the model API.
// startGateway() returns once the API listens and every loop has settled the first pass.

import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import { checkManagementExposure, readApiToken } from '../api/api-token.js';
import { systemClock, type Clock } from '../clock.js';
import { checkDstackCompatHost } from '../compat/dstack/index.js';
import { gatewayLoops, apiTarget, type GatewayLoopDeps } from '../gateway/loops.js';
import type { Server } from 'node:http';
import { liveDataPlane } from '../dataplane/index.js';
import { countWriteFailures } from '../state/write-failures.js';
import { detailResponse } from '../dataplane/detail.js';
import type { ModelApiHandOff } from '../dataplane/relay-connection.js';
import { ProxyError } from '../errors.js';
import { accessLogPath, prepareGatewayHost, socketDirOf, type GatewayHost } from '../gateway/nginx-host.js';
import type { GatewayOptions } from '../gateway/options.js';
import { gatewayAuth, gatewayRoutes } from '../gateway/routes.js';
import { ENTRYPOINT_KEY_HEADER, fileFirstSeenStore, observeModels } from '../models/index.js';
import type { Controller } from '../reconcilers/controller.js';
import { NGINX_LOOP, type NginxLoopStats } from '../reconcilers/nginx/loop.js';
import { SSH_LOOP } from '../reconcilers/ssh/index.js';
import type { NginxProcess } from '../reconcilers/nginx/nginx-process.js';
import type { SshLoop } from '../reconcilers/ssh/index.js';
import { openCachedStore } from '../state/cached-store.js';
import { openStore, parseStoreUrl, redactStoreUrl } from '../state/open-store.js';
import { openPgCertificates } from '../gateway/postgres-certificates.js';
import type { SharedCertificates } from '../reconcilers/tls/shared.js';
import { openWatchedFileStore } from '../state/watched-file-store.js';
import type { WatchedStateStore } from '../state/watched-store.js';
import { createStatsCollector } from '../stats/index.js';
import { assemble } from './assemble.js';

export interface Gateway {
  app: FastifyInstance;
  controller: Controller;
  store: WatchedStateStore;
  /** http://host:port of the API. */
  apiUrl: string;
  nginxStats: NginxLoopStats;
  /** Reload without waiting out the interval until the document at `generation` is served (see the Nginx loop's hurry). */
  hurryReload(generation: number): void;
  /** Tunnels and the per-service balancer (connect(serviceKey) for in-process proxies). */
  ssh: SshLoop;
  /** The private Nginx, when it runs one. */
  nginx: NginxProcess | undefined;
  paths: { stateDir: string; confDir: string; accessLog: string; acmeWebroot: string };
  close(): Promise<void>;
}

export interface GatewayDeps extends GatewayLoopDeps {
  logger?: Logger;
  clock?: Clock;
}

export async function startGateway(options: GatewayOptions, deps: GatewayDeps = {}): Promise<Gateway> {
  const logger = deps.logger ?? pino({ level: options.logLevel, base: { svc: 'dstack-proxy' } });
  const clock = deps.clock ? { clock: deps.clock } : {};
  let apiToken: string | undefined;
  let host!: GatewayHost;
  let loops!: ReturnType<typeof gatewayLoops>;
  const stateDir = resolve(options.stateDir);
  let controller!: Pick<Controller, 'statuses'>;
  /** The gateway this one takes over from (--take-over true), found serving this state dir at start. */
  let predecessor: { pid: number | null } | undefined;
  let writeFailures = (): number => 0;
  /** With --db postgres://…: the fleet's certificates. */
  let shared: SharedCertificates | undefined;
  /** The API's HTTP server, once built: the data plane gives it the model API's connections. */
  let apiServer: Server | undefined;
  const modelApi: ModelApiHandOff = (socket, head) => {
    // The data plane is bound before the API is built: a model request this early waits for nothing.
    if (apiServer === undefined) return void socket.end(detailResponse(503, 'the model API is starting', false));
    if (head.length > 0) socket.unshift(head);
    apiServer.emit('connection', socket);
    socket.resume();
  };
  // Both touch nothing until used.
  const firstSeen = fileFirstSeenStore(join(stateDir, 'models.json'));
  const auth = gatewayAuth(options, logger, deps.clock);
  const stats = createStatsCollector({ accessLogPath: accessLogPath(options), logger: logger.child({ component: 'stats' }) });
  const daemon = await assemble({
    logger,
    ...clock,
    resyncIntervalMs: options.resyncInterval * 1000,
    async preflight() {
      // dstack's routes take no token: they never go beyond loopback, token or not.
      if (options.dstackCompat === 'true') await checkDstackCompatHost(options.apiHost);
      apiToken = options.apiTokenFile ? await readApiToken(options.apiTokenFile, logger) : undefined;
      await checkManagementExposure(
        {
          what: 'the management API (/api/v1/*, /metrics, /api/stats/collect)',
          host: options.apiHost,
          port: options.apiPort,
          hostFlag: '--api-host',
          tokenFlag: '--api-token-file',
          insecureFlag: '--insecure-open-api true',
          hasToken: apiToken !== undefined,
          insecure: options.insecureOpenApi === 'true',
        },
        logger,
      );
      predecessor = await findPredecessor(options, logger);
    },
    // A corrupt state.json fails here, before anything else is touched.
    async store() {
      const storeLogger = logger.child({ component: 'store' });
      // Several gateways on one database share one document; each converges its own Nginx.
      // A copy of the last document in the state dir lets it start while the database is down.
      const db = options.db;
      const opened = db
        ? await openCachedStore({
            open: () => openStore(db, { logger: storeLogger, ...clock }),
            cacheFile: join(stateDir, DOCUMENT_COPY),
            logger: storeLogger,
            ...clock,
          })
        : await openWatchedFileStore({ stateDir, logger: storeLogger, ...clock });
      const store = countWriteFailures(opened);
      writeFailures = () => store.writeFailures();
      return store;
    },
    async loops(d) {
      controller = { statuses: () => d.controller.statuses() };
      // Closed after the loops: a data plane still draining checks tokens with it.
      d.defer(() => auth.close());
      host = await prepareGatewayHost(options, logger, () => d.controller.notify());
      // Taking over: the shared socket is bound beside the running gateway's, and Nginx is
      // pointed at it once this process serves the document (takeOver below).
      const loopDeps = { ...deps, ssh: { ...deps.ssh, modelApi, ...(predecessor ? { handOver: true } : {}) } };
      // On PostgreSQL the fleet shares its certificates too: one gateway orders, all install.
      if (options.db && parseStoreUrl(options.db).kind === 'postgres') {
        const store = openPgCertificates({ connectionString: options.db, logger: logger.child({ component: 'certificates' }), ...clock });
        shared = store;
        d.defer(() => store.close());
      }
      loops = gatewayLoops(options, host, () => d.current().generation, loopDeps, auth, shared);
      // The data-plane socket before anything can name a service: a host the document has
      // just brought in reaches it (404 until the data plane has it), never a missing path.
      await loops.ssh.balancer.listenShared();
      return [loops.ssh, loops.tls, loops.nginx];
    },
    statusExtra() {
      const n = loops.nginx.stats;
      return { nginx: { reloads: n.reloads, reloadFailures: n.reloadFailures, lastReloadAt: n.lastReloadAt } };
    },
    planNotes: (loop, kinds) => (loop === NGINX_LOOP ? { reload: kinds.some((k) => k !== 'conflict') } : undefined),
    onGeneration: async (s) => void (await observeModels(firstSeen, s.state, Math.floor(Date.now() / 1000))),
    async listeners(d) {
      d.defer(() => stats.stop());
      const routes = gatewayRoutes(d, options, { host, loops, stats, firstSeen, auth, writeFailures, ...(shared ? { shared } : {}) });
      // The entrypoint sites proxy the model API to this listener: what they bring reaches nothing else.
      const proxied = { header: ENTRYPOINT_KEY_HEADER, prefix: '/api/models/' };
      // serveWhileClosing: the model API's connections come from the data plane, which serves
      // on while this process drains (or waits for a successor).
      const app = { ...(apiToken ? { apiToken } : {}), routes, proxied, serveWhileClosing: true };
      return [{ host: options.apiHost, port: options.apiPort, app }];
    },
    async beforeListen([app]) {
      stats.start();
      await app!.ready();
      apiServer = app!.server;
    },
    listening([port], d) {
      // With --api-port 0 the sites learn the real port before the first pass renders them.
      loops.view.apiUrl = apiTarget(options.apiHost, port!);
      logger.info(
        {
          port,
          generation: d.current().generation,
          nginx: options.nginx,
          confDir: host.confDir,
          db: options.db ? redactStoreUrl(options.db) : undefined,
        },
        'gateway listening',
      );
    },
    takingOver: () => predecessor !== undefined,
    async takeOver() {
      // Its own tunnels first: a replica still making its first connection here is one only
      // the old process can serve yet (a settled pass has started them, not waited for them).
      await firstConnections(() => controller.statuses().loops[SSH_LOOP]?.objects ?? {}, TUNNELS_WAIT_MS, deps.clock ?? systemClock);
      await loops.ssh.balancer.publish();
      const pid = predecessor!.pid;
      logger.info({ pid }, 'took the data plane over; telling the gateway taken over from to stop');
      if (pid === null) {
        logger.warn('the gateway taken over from did not say its pid: stop it, for this one to listen on its API port');
        return;
      }
      try {
        process.kill(pid, 'SIGTERM');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
      }
    },
    // The one taken over from closes its API first thing once it is told to stop and no longer
    // holds the data plane.
    takeOverListenMs: 30_000,
    // Nginx serves the document; certificates still being requested arrive later on their own.
    readyWhen: 'settled',
    ready: (d) => logger.info({ generation: d.current().generation }, 'first reconcile pass settled'),
  });
  // A restart: the next gateway starts only once this one was told to stop. Until it has taken
  // the data plane over, this one goes on whole (sites, loops, the management API), as it does
  // beside a gateway taking over on an update; the API's port is then free for it within
  // milliseconds instead of the seconds a process takes to start.
  const successorWaitMs = options.nginx === 'system' ? options.successorWait * 1000 : 0;
  let closing: Promise<void> | undefined;
  const closeGateway = async (): Promise<void> => {
    if (successorWaitMs > 0) await loops.ssh.balancer.awaitSuccessor(successorWaitMs).catch(() => false);
    await daemon.close();
  };
  return {
    app: daemon.apps[0]!,
    controller: daemon.controller,
    store: daemon.store,
    apiUrl: daemon.urls[0]!,
    nginxStats: loops.nginx.stats,
    hurryReload: (generation) => loops.nginx.hurry(generation),
    ssh: loops.ssh,
    nginx: host.nginx,
    paths: { stateDir: host.stateDir, confDir: host.confDir, accessLog: host.accessLog, acmeWebroot: host.workerDirs.acmeWebroot },
    close: () => (closing ??= closeGateway()),
  };
}

/**
 * A gateway already serving this state dir (its data-plane socket accepts): refused, unless
 * this one is to take over from it.
 */
async function findPredecessor(options: GatewayOptions, logger: Logger): Promise<{ pid: number | null } | undefined> {
  const live = await liveDataPlane(socketDirOf(options));
  if (live === undefined) {
    if (options.takeOver === 'true') logger.info('--take-over true: no gateway serves this state dir, starting as usual');
    return undefined;
  }
  if (options.takeOver === 'true') {
    if (options.nginx !== 'system') {
      throw new ProxyError(
        'DP_ERR_BAD_OPTION',
        `another gateway${live.pid === null ? '' : ` (pid ${live.pid})`} serves ${resolve(options.stateDir)}, and --take-over true needs --nginx system: a private Nginx lives and dies with the gateway that started it`,
      );
    }
    if (options.apiPort === 0) {
      throw new ProxyError('DP_ERR_BAD_OPTION', "--take-over true takes the running gateway's API port over: --api-port 0 names none");
    }
    logger.info({ pid: live.pid }, 'taking over from the gateway that serves this state dir');
    return live;
  }
  throw new ProxyError(
    'DP_ERR_ALREADY_SERVED',
    `another gateway${live.pid === null ? '' : ` (pid ${live.pid})`} serves ${resolve(options.stateDir)}: stop it first, or start this one with --take-over true to take over from it without dropping a request`,
  );
}

/** With --db: the copy of the last document served, in the state dir. */
const DOCUMENT_COPY = 'document-copy.json';

/** How long a take-over waits for its tunnels' first connections before it serves anyway. */
const TUNNELS_WAIT_MS = 30_000;

/** Until no replica's tunnel is making its first connection (reason Connecting), or `ms` passed. */
async function firstConnections(
  objects: () => Record<string, { conditions: readonly { type: string; reason?: string }[] }>,
  ms: number,
  clock: Clock,
): Promise<void> {
  const until = clock.now() + ms;
  const connecting = (): boolean =>
    Object.values(objects()).some((o) => o.conditions.some((c) => c.type === 'Ready' && c.reason === 'Connecting'));
  while (connecting() && clock.now() < until) await new Promise<void>((r) => clock.setTimeout(r, 20));
}
