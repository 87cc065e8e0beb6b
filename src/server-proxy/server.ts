// The standalone in-server proxy (`dstack-proxy server-proxy`): the document from a database
// (SQLite or PostgreSQL, watched), the SSH loop in-process with a tunnel for every replica, and
// one fastify app serving PUT/GET /api/v1/state (the gateway's route module), /proxy/services,
// /api/stats/collect, /api/v1/status, /healthz and /readyz. Several processes on one
// PostgreSQL serve the same document: a commit through any of them reaches all within 1 s.
//
// The management routes (state, status, stats) rewrite or reveal all routing. They are served
// either on the proxy's listener or, with `apiPort`, on a listener of their own (loopback by
// default) — and without an API token only on a loopback address: start refuses otherwise
// unless `insecureOpenApi` says so.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import { checkManagementExposure, readApiToken } from '../api/api-token.js';
import { buildApp, type AppOptions } from '../api/app.js';
import { createControlServerAuth, noServerAuth, type AuthProvider } from '../auth/index.js';
import { planFromController } from '../api/plan.js';
import type { Runtime } from '../api/runtime.js';
import { statsRoutes } from '../api/stats-routes.js';
import { connectForwarder, fileFirstSeenStore, registerModelApi } from '../models/index.js';
import { ProxyError } from '../errors.js';
import type { Clock } from '../clock.js';
import { Controller } from '../reconcilers/controller.js';
import { createSshLoop, NoReadyReplicaError, type SshLoop, type SshLoopOptions } from '../reconcilers/ssh/index.js';
import type { AnyLoop } from '../reconcilers/types.js';
import type { ProxyState } from '../spec/index.js';
import { openStore, redactStoreUrl } from '../state/open-store.js';
import type { StoredState } from '../state/store.js';
import type { WatchedStateStore } from '../state/watched-store.js';
import type { Authorize } from './admit.js';
import { registerServerProxy, type ServerProxy } from './plugin.js';
import type { ConnectFn } from './upstream.js';

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
  /** Allow management routes without a token on a non-loopback address (a firewall you trust). */
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
export type ExtraRoutes = (app: FastifyInstance, ctx: { getState: () => ProxyState; authorize: Authorize; connect: ConnectFn }) => Promise<void>;

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
  /** The management app: `app` itself, or the one on apiPort. */
  apiApp: FastifyInstance;
  /** http://host:port of the management routes: `url`, or the apiPort listener's. */
  apiUrl: string;
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
  const cleanups: (() => Promise<unknown> | unknown)[] = [];
  const close = async (): Promise<void> => {
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch((err: unknown) => logger.warn({ err }, 'shutdown step failed'));
    cleanups.length = 0;
  };
  try {
    // 0. Refuse an open management API before touching anything.
    const host = o.host ?? '127.0.0.1';
    const port = o.port ?? 8080;
    const separate = o.apiPort !== undefined;
    if (o.apiHost !== undefined && !separate) throw new ProxyError('DP_ERR_BAD_OPTION', '--api-host needs --api-port (management on its own listener)');
    const apiHost = separate ? (o.apiHost ?? '127.0.0.1') : host;
    const apiToken = o.apiTokenFile ? await readApiToken(o.apiTokenFile, logger) : undefined;
    await checkManagementExposure(
      {
        what: 'the management API (/api/v1/state, /api/v1/status, /api/stats/collect)',
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

    // 1. The document, and a watch that hands every new generation to the controller.
    const store = await openStore(o.db, { logger: logger.child({ component: 'store' }), ...(deps.pollMs ? { pollMs: deps.pollMs } : {}) });
    cleanups.push(() => store.close());
    let current = await store.read();

    // 2. Tunnels: the SSH loop in-process, eager for every replica; connections via the balancer.
    let stateDir = o.stateDir ? resolve(o.stateDir) : undefined;
    if (!stateDir) {
      const dir = await mkdtemp(join(tmpdir(), 'dstack-proxy-'));
      stateDir = dir;
      cleanups.push(() => rm(dir, { recursive: true, force: true }));
    }
    const ssh = createSshLoop({ stateDir, ...(deps.ssh ?? {}) });
    cleanups.push(() => ssh.close());
    const controller = new Controller({
      loops: [ssh] as unknown as AnyLoop[],
      getSpec: () => ({ state: current.state, generation: current.generation }),
      logger: logger.child({ component: 'controller' }),
      ...(o.resyncIntervalMs ? { resyncIntervalMs: o.resyncIntervalMs } : {}),
      ...(deps.clock ? { clock: deps.clock } : {}),
    });
    cleanups.push(() => controller.stop());
    const unwatch = store.watch((next) => {
      current = next;
      logger.info({ generation: next.generation, hash: next.hash }, 'serving a new generation');
      controller.notify();
    });
    cleanups.push(unwatch);

    let auth: AuthProvider = noServerAuth;
    if (o.serverUrl) {
      auth = createControlServerAuth({ serverUrl: o.serverUrl, logger: logger.child({ component: 'auth' }), ...(deps.clock ? { clock: deps.clock } : {}) });
      cleanups.push(() => auth.close());
    }
    const authorize: Authorize = deps.authorize ?? ((project, token) => auth.check(project, token));
    const connect = balancerConnect(ssh);

    // 3. The HTTP app: the gateway's API module (state routes, status, probes) plus the proxy,
    //    its stats, and the model API over the same tunnels.
    let ready = false;
    const getState = (): ProxyState => current.state;
    const runtime: Runtime = {
      store,
      plan: (next, base) => planFromController(controller, next, base),
      // A write through this process is reported by the watch too; reading here only makes it sooner.
      notify() {
        // A failed read must not become an unhandled rejection (fatal in Node): the watch delivers it.
        store.read().then(
          (s) => {
            if (s.generation > current.generation) {
              current = s;
              controller.notify();
            }
          },
          (err: unknown) => logger.warn({ err }, 'reading the state after a write failed; the watch will deliver it'),
        );
      },
      status: () => controller.statuses(),
      isReady: () => ready,
    };
    let proxy: ServerProxy | undefined;
    const models = connectForwarder(connect);
    cleanups.push(() => models.close());
    const proxyRoutes: NonNullable<AppOptions['routes']> = [
      async (a) => {
        proxy = await registerServerProxy(a, {
          getState,
          connect,
          authorize,
          logger: logger.child({ component: 'proxy' }),
          ...(o.connectTimeoutMs ? { connectTimeoutMs: o.connectTimeoutMs } : {}),
          ...(o.readTimeoutMs ? { readTimeoutMs: o.readTimeoutMs } : {}),
          ...(deps.clock ? { clock: deps.clock } : {}),
        });
      },
      async (a) =>
        registerModelApi(a, {
          prefix: '/proxy/models/:project',
          getState,
          authorize,
          forward: (service, request) => models.forward(service, request),
          firstSeen: fileFirstSeenStore(join(stateDir, 'models.json')),
          ...(deps.clock ? { clock: deps.clock } : {}),
        }),
      ...(deps.extraRoutes ? [async (a: FastifyInstance) => deps.extraRoutes!(a, { getState, authorize, connect })] : []),
    ];
    const managementRoutes: NonNullable<AppOptions['routes']> = [
      async (a, guard) => a.register(statsRoutes, { collector: proxy!.stats, getState, guard }),
    ];
    const appLogger = logger.child({ component: 'api' });
    // One app for everything, or the proxy's app without management plus a management app.
    const app = await buildApp({
      runtime,
      logger: appLogger,
      ...(apiToken ? { apiToken } : {}),
      statusExtra: () => ({ store: store.health() }),
      ...(separate ? { management: false, routes: proxyRoutes } : { routes: [...proxyRoutes, ...managementRoutes] }),
    });
    cleanups.push(() => app.close());
    let apiApp = app;
    if (separate) {
      apiApp = await buildApp({
        runtime,
        logger: appLogger,
        ...(apiToken ? { apiToken } : {}),
        statusExtra: () => ({ store: store.health() }),
        routes: managementRoutes,
      });
      cleanups.push(() => apiApp.close());
    }

    // 4. Listen, then the first pass (tunnels opening; /readyz says so until it is done).
    await app.listen({ host, port });
    const url = `http://${urlHost(host)}:${(app.server.address() as { port: number }).port}`;
    let apiUrl = url;
    if (separate) {
      await apiApp.listen({ host: apiHost, port: o.apiPort! });
      apiUrl = `http://${urlHost(apiHost)}:${(apiApp.server.address() as { port: number }).port}`;
    }
    await controller.start();
    ready = true;
    logger.info({ url, apiUrl, db: redactStoreUrl(o.db), generation: current.generation }, 'server proxy listening');
    return { app, url, apiApp, apiUrl, store, controller, ssh, proxy: proxy!, current: () => current, close };
  } catch (err) {
    await close();
    throw err;
  }
}

function urlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

/**
 * balancer.connect, with one refinement: when Ready replicas existed but every one refused,
 * that is the replica's failure (502), not "no Ready replica" (503). The balancer does not say
 * which it was, so the open-failure counter tells (a concurrent failure may be misattributed).
 */
function balancerConnect(ssh: SshLoop): ConnectFn {
  return async (key) => {
    const before = ssh.balancer.stats.openFailures;
    try {
      return await ssh.balancer.connect(key);
    } catch (err) {
      if (err instanceof NoReadyReplicaError && ssh.balancer.stats.openFailures > before) {
        throw Object.assign(new Error(`every Ready replica of ${key} refused the connection`), { status: 502 });
      }
      throw err;
    }
  };
}


