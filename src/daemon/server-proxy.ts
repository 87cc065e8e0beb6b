// The standalone in-server proxy (`dstack-proxy server-proxy`): the document from a database
// (SQLite or PostgreSQL) or a state directory, watched; the SSH loop in-process with a tunnel
// for every replica; and one fastify app serving PUT/GET /api/v1/state, /proxy/services,
// /proxy/models, /api/stats/collect, /api/v1/status, /healthz and /readyz. Several processes
// on one PostgreSQL serve the same document: a commit through any of them reaches all within 1 s.
//
// The management routes (state, status, stats, metrics) rewrite or reveal all routing. The
// proxy's listener carries proxied requests, and the TLS terminator or load balancer normally in
// front of it on the same host makes every one of them arrive from loopback: a loopback address
// says nothing about who is calling. So that listener serves management only behind the API
// token, or when `insecureOpenApi` opens it explicitly; otherwise management is on a listener of
// its own (`apiPort`, loopback by default, which nothing proxied reaches) or off, and the proxy's
// listener answers those routes 403 DP_ERR_MANAGEMENT_OFF naming the ways to turn it on.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import { checkManagementExposure, readApiToken } from '../api/api-token.js';
import { createMetrics, metricsRoutes } from '../api/metrics.js';
import { statsRoutes } from '../api/stats-routes.js';
import { createControlServerAuth, noServerAuth } from '../auth/index.js';
import type { Clock } from '../clock.js';
import { ProxyError } from '../errors.js';
import type { ReplicaRouter } from '../dataplane/index.js';
import { fileFirstSeenStore, registerModelApi, replicaForwarder } from '../models/index.js';
import type { Controller } from '../reconcilers/controller.js';
import { createSshLoop, type SshLoop, type SshLoopOptions } from '../reconcilers/ssh/index.js';
import type { Authorize } from '../server-proxy/admit.js';
import { registerServerProxy, type ServerProxy } from '../server-proxy/plugin.js';
import type { ProxyState } from '../spec/index.js';
import { openStore, redactStoreUrl } from '../state/open-store.js';
import type { StoredState } from '../state/store.js';
import type { WatchedStateStore } from '../state/watched-store.js';
import { assemble, type RouteModule } from './assemble.js';

export interface ServerProxyServerOptions {
  /** `sqlite:PATH`, `postgres://…`, or a state directory (state.json). */
  db: string;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 8080; 0 picks a free port. */
  port?: number;
  /** The control server answering `POST /api/projects/<p>/get` (auth: true services). Without it they are refused. */
  serverUrl?: string;
  /** Balancer sockets and scratch files. Default a private temporary directory, removed at close. */
  stateDir?: string;
  /** Protects /api/v1/* and /api/stats/collect with a bearer token (the file holds it). */
  apiTokenFile?: string;
  /**
   * Serve the management routes (/api/v1/*, /api/stats/collect) on their own listener at
   * apiHost:apiPort instead of the proxy's (0 picks a free port). The proxy's listener then
   * answers them 404.
   */
  apiPort?: number;
  /** With apiPort: its address. Default 127.0.0.1. */
  apiHost?: string;
  /**
   * Serve the management routes without a token on the proxy's listener (any address), or on a
   * non-loopback apiHost: only behind a firewall you trust, with nothing proxying to it.
   */
  insecureOpenApi?: boolean;
  /** Default 10 s. */
  connectTimeoutMs?: number;
  /** Default 300 s. */
  readTimeoutMs?: number;
  /** Every loop runs at least this often. Default 60 s. */
  resyncIntervalMs?: number;
  logLevel?: string;
}

/** Mount point for routes that need the same state, auth and connections (the model API). */
export type ExtraRoutes = (
  app: FastifyInstance,
  ctx: { getState: () => ProxyState; authorize: Authorize; replicas: ReplicaRouter },
) => Promise<void>;

export interface ServerProxyDeps {
  logger?: Logger;
  clock?: Clock;
  /** SSH loop overrides (tests: short keepalive, reconnect). */
  ssh?: Partial<SshLoopOptions>;
  /** Replaces the control-server check (a host server's own). */
  authorize?: Authorize;
  /** Store poll interval (SQLite, state.json) / safety-net poll (PostgreSQL). */
  pollMs?: number;
  /** Registered after the proxy routes: `/proxy/models/:project/*` goes here. */
  extraRoutes?: ExtraRoutes;
}

export interface RunningServerProxy {
  app: FastifyInstance;
  /** http://host:port */
  url: string;
  /** The management app: `app` itself, the one on apiPort, or undefined when management is off. */
  apiApp: FastifyInstance | undefined;
  /** http://host:port of the management routes: `url`, the apiPort listener's, or undefined when they are off. */
  apiUrl: string | undefined;
  store: WatchedStateStore;
  controller: Controller;
  ssh: SshLoop;
  proxy: ServerProxy;
  /** The generation being served. */
  current(): StoredState;
  close(): Promise<void>;
}

export async function startServerProxy(o: ServerProxyServerOptions, deps: ServerProxyDeps = {}): Promise<RunningServerProxy> {
  const logger = deps.logger ?? pino({ level: o.logLevel ?? 'info', base: { svc: 'dstack-proxy', mode: 'server-proxy' } });
  const clock = deps.clock ? { clock: deps.clock } : {};
  const [host, port, separate] = [o.host ?? '127.0.0.1', o.port ?? 8080, o.apiPort !== undefined];
  const apiHost = separate ? (o.apiHost ?? '127.0.0.1') : host;
  const management = managementPlace(o);
  let apiToken: string | undefined;
  let ssh!: SshLoop;
  let stateDir = o.stateDir ? resolve(o.stateDir) : undefined;
  let proxy: ServerProxy | undefined;
  const daemon = await assemble({
    logger,
    ...clock,
    ...(o.resyncIntervalMs ? { resyncIntervalMs: o.resyncIntervalMs } : {}),
    async preflight() {
      if (o.apiHost !== undefined && !separate)
        throw new ProxyError('DP_ERR_BAD_OPTION', '--api-host needs --api-port (management on its own listener)');
      apiToken = o.apiTokenFile ? await readApiToken(o.apiTokenFile, logger) : undefined;
      if (management === 'off') {
        logger.warn({ url: `http://${host}:${port}` }, MANAGEMENT_OFF_LOG);
        return;
      }
      if (management === 'proxy-listener' && apiToken === undefined) {
        logger.warn(
          { host, port },
          "the management routes are open without a token on the proxy's listener (--insecure-open-api): " +
            'whatever proxies to it (a load balancer or TLS terminator) lets anyone rewrite all routing',
        );
      }
      await checkManagementExposure(
        {
          what: 'the management API (/api/v1/state, /api/v1/status, /metrics, /api/stats/collect)',
          host: apiHost,
          port: separate ? o.apiPort! : port,
          hostFlag: separate ? '--api-host' : '--host',
          tokenFlag: '--api-token-file',
          insecureFlag: '--insecure-open-api',
          ...(separate ? {} : { alternative: 'move it to its own loopback listener (--api-port PORT)' }),
          hasToken: apiToken !== undefined,
          insecure: o.insecureOpenApi === true,
        },
        logger,
      );
    },
    store: () =>
      openStore(o.db, { logger: logger.child({ component: 'store' }), ...(deps.pollMs ? { pollMs: deps.pollMs } : {}), ...clock }),
    // Tunnels: the SSH loop in-process, eager for every replica; requests via its replicas.
    async loops(d) {
      if (!stateDir) {
        const dir = (stateDir = await mkdtemp(join(tmpdir(), 'dstack-proxy-')));
        d.defer(() => rm(dir, { recursive: true, force: true }));
      }
      // The data plane's timeouts are the proxy's: the SSH loop creates it.
      const { replicas: replicaOptions, ...sshOptions } = deps.ssh ?? {};
      ssh = createSshLoop({
        stateDir,
        ...(o.connectTimeoutMs ? { connectTimeoutMs: o.connectTimeoutMs } : {}),
        ...sshOptions,
        replicas: {
          logger: logger.child({ component: 'dataplane' }),
          ...(o.readTimeoutMs ? { readTimeoutMs: o.readTimeoutMs } : {}),
          ...replicaOptions,
        },
      });
      return [ssh];
    },
    async listeners(d) {
      const auth = o.serverUrl
        ? createControlServerAuth({ serverUrl: o.serverUrl, logger: logger.child({ component: 'auth' }), ...clock })
        : noServerAuth;
      d.defer(() => auth.close());
      const authorize: Authorize = deps.authorize ?? ((project, token) => auth.check(project, token));
      // One data plane for /proxy/services and /proxy/models: one choice, one set of pools.
      const replicas: ReplicaRouter = ssh.replicas;
      const models = replicaForwarder(replicas);
      const getState = (): ProxyState => d.current().state;
      const proxyRoutes: RouteModule[] = [
        async (a) => {
          proxy = await registerServerProxy(a, {
            getState,
            replicas,
            authorize,
            logger: logger.child({ component: 'proxy' }),
            // The WebSocket idle timeout; HTTP's are the data plane's (above).
            ...(o.readTimeoutMs ? { readTimeoutMs: o.readTimeoutMs } : {}),
            ...clock,
          });
        },
        async (a) =>
          registerModelApi(a, {
            prefix: '/proxy/models/:project',
            getState,
            authorize,
            forward: (service, request) => models.forward(service, request),
            firstSeen: fileFirstSeenStore(join(stateDir!, 'models.json')),
            ...clock,
          }),
        ...(deps.extraRoutes ? [async (a: FastifyInstance) => deps.extraRoutes!(a, { getState, authorize, replicas })] : []),
      ];
      // The same figures as the gateway's where they apply: the loop's counters, the document,
      // the tunnels and the replicas' requests in flight.
      const metrics = createMetrics({
        loops: () => d.controller.counters(),
        generation: () => d.current().generation,
        families: ssh.metrics(),
      });
      const managementRoutes: RouteModule[] = [
        async (a, guard) => a.register(statsRoutes, { collector: proxy!.stats, getState, guard }),
        async (a, guard) => a.register(metricsRoutes, { metrics, guard }),
      ];
      const token = apiToken ? { apiToken } : {};
      // One app for everything, the proxy's app without management, or that plus a management app.
      if (management === 'proxy-listener') return [{ host, port, app: { ...token, routes: [...proxyRoutes, ...managementRoutes] } }];
      if (management === 'off') return [{ host, port, app: { management: false, routes: [...proxyRoutes, managementOff] } }];
      return [
        { host, port, app: { ...token, management: false, routes: proxyRoutes } },
        { host: apiHost, port: o.apiPort!, app: { ...token, routes: managementRoutes } },
      ];
    },
    // Tunnels opening: /readyz says so until the first pass is done.
    readyWhen: 'done',
    ready: (d, [url, apiUrl = url]) =>
      logger.info(
        { url, apiUrl: management === 'off' ? 'off' : apiUrl, db: redactStoreUrl(o.db), generation: d.current().generation },
        'server proxy listening',
      ),
  });
  const [app, second] = daemon.apps as [FastifyInstance, FastifyInstance?];
  const [url, secondUrl] = daemon.urls as [string, string?];
  const on = management === 'off' ? undefined : { apiApp: second ?? app, apiUrl: secondUrl ?? url };
  const { store, controller, current, close } = daemon;
  return { app, url, apiApp: on?.apiApp, apiUrl: on?.apiUrl, store, controller, ssh, proxy: proxy!, current, close };
}

/**
 * Where the management routes go: a listener of their own with apiPort; the proxy's listener
 * only behind the token or when opened explicitly; otherwise nowhere.
 */
function managementPlace(o: ServerProxyServerOptions): 'own-listener' | 'proxy-listener' | 'off' {
  if (o.apiPort !== undefined) return 'own-listener';
  return o.apiTokenFile !== undefined || o.insecureOpenApi === true ? 'proxy-listener' : 'off';
}

const MANAGEMENT_WAYS =
  'give --api-token-file FILE (the routes then ask for it), or --api-port PORT (a loopback listener of their own, ' +
  'which nothing proxied reaches), or --insecure-open-api to serve them open on this listener';

const MANAGEMENT_OFF_LOG =
  "the management routes (/api/v1/state, /api/v1/status, /metrics, /api/stats/collect) are off on the proxy's listener: " +
  `a load balancer on this host would make anyone look local. To serve them, ${MANAGEMENT_WAYS}`;

/** The proxy's listener with management off: those routes say so, and how to turn them on. */
const managementOff: RouteModule = async (app) => {
  const refuse = async (): Promise<never> => {
    throw new ProxyError('DP_ERR_MANAGEMENT_OFF', `management is off on this listener; to serve it, ${MANAGEMENT_WAYS}`);
  };
  for (const url of ['/api/v1/state', '/api/v1/status', '/metrics', '/api/stats/collect']) {
    // Refused on arrival: a PUT's body is not read.
    app.route({ method: url === '/api/v1/state' ? ['GET', 'PUT'] : 'GET', url, onRequest: refuse, handler: refuse });
  }
};
