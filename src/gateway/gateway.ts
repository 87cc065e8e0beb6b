// The gateway daemon: state store + controller + loops + private or system Nginx + HTTP API.
// startGateway() returns once the API listens and the first reconcile pass has finished.

import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import { buildApp } from '../api/app.js';
import { checkManagementExposure, readApiToken, thisHostOnly } from '../api/api-token.js';
import { planFromController } from '../api/plan.js';
import type { Runtime } from '../api/runtime.js';
import { Controller } from '../reconcilers/controller.js';
import type { Clock } from '../clock.js';
import { createNginxLoop, DEFAULT_MIN_RELOAD_INTERVAL_MS, NGINX_LOOP, type NginxLoopOptions, type NginxLoopStats } from '../reconcilers/nginx/loop.js';
import { NginxProcess, systemNginx, testConfig, writeMainConf } from '../reconcilers/nginx/nginx-process.js';
import { certForFromStatus, createTlsLoop, TLS_LOOP, type TlsLoop } from '../reconcilers/tls/index.js';
import { removeEabLeftovers } from '../reconcilers/tls/certbot.js';
import { createSshLoop, SSH_LOOP, type SshLoop, type SshLoopOptions } from '../reconcilers/ssh/index.js';
import type { AnyLoop, StatusSnapshot } from '../reconcilers/types.js';
import { createStatsCollector } from '../stats/index.js';
import { authRoutes } from '../api/auth-routes.js';
import { createControlServerAuth, noServerAuth } from '../auth/index.js';
import { createMetrics, metricsRoutes, type CertificateMetric, type TunnelMetric } from '../api/metrics.js';
import { statsRoutes } from '../api/stats-routes.js';
import { entrypointClient, fileFirstSeenStore, nginxForwarder, observeModels, registerModelApi } from '../models/index.js';
import { serviceKey, type ProxyState } from '../spec/index.js';
import { openFileStore } from '../state/file-store.js';
import type { StateStore, StoredState } from '../state/store.js';
import { prepareInternalListener, removeStaleSocket } from './internal-listener.js';
import { lookupUser, prepareWorkerDirs } from './nginx-worker.js';
import type { GatewayOptions } from './options.js';

export interface Gateway {
  app: FastifyInstance;
  controller: Controller;
  store: StateStore;
  /** http://host:port of the API. */
  apiUrl: string;
  nginxStats: NginxLoopStats;
  /** Tunnels and the per-service balancer (connect(serviceKey) for in-process proxies). */
  ssh: SshLoop;
  /** The private Nginx, when it runs one. */
  nginx: NginxProcess | undefined;
  paths: { stateDir: string; confDir: string; accessLog: string; acmeWebroot: string };
  close(): Promise<void>;
}

export interface GatewayDeps {
  logger?: Logger;
  clock?: Clock;
  /** Test hook passed to the Nginx loop. */
  renderHook?: NginxLoopOptions['renderHook'];
  /** SSH loop overrides (tests: short keepalive, reconnect). */
  ssh?: Partial<SshLoopOptions>;
  /** DNS pre-flight resolver of the TLS loop (tests resolve everything to 127.0.0.1). */
  resolve?: (domain: string) => Promise<unknown>;
  /** Nginx loop overrides (the bench compares reload intervals). */
  nginxLoop?: Pick<NginxLoopOptions, 'minReloadIntervalMs'>;
}

export async function startGateway(options: GatewayOptions, deps: GatewayDeps = {}): Promise<Gateway> {
  const logger = deps.logger ?? pino({ level: options.logLevel, base: { svc: 'dstack-proxy' } });
  const stateDir = resolve(options.stateDir);

  // 0. Management open to the network without a token is refused before anything is touched.
  const apiToken = options.apiTokenFile ? await readApiToken(options.apiTokenFile, logger) : undefined;
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

  // 1. State: fails here, before anything is touched, when state.json is corrupt.
  const store = await openFileStore({ stateDir });
  let current: StoredState = await store.read();

  // 2. Nginx: a private master under the state dir, or the system one. Its workers run as
  // --nginx-user and reach only the worker dir (balancer sockets, ACME webroot, temp files);
  // a private Nginx started without root runs them as our own user.
  const switchesUser = options.nginx === 'system' || process.getuid?.() === 0;
  const worker = switchesUser ? await lookupUser(options.nginxUser) : null;
  const workerDirs = await prepareWorkerDirs(options.nginxWorkerDir ? resolve(options.nginxWorkerDir) : `${stateDir}-nginx`, worker, logger);
  const acmeWebroot = workerDirs.acmeWebroot;
  const logsDir = join(stateDir, 'logs');
  await mkdir(logsDir, { recursive: true });
  const accessLog = join(logsDir, 'access.log');
  // The model API's way into Nginx: a Unix socket only the gateway's user can reach.
  const internal = await prepareInternalListener(stateDir);
  // certbot's EAB config files (the HMAC key) that a crash during a run left behind.
  await removeEabLeftovers(certbotDirsUnder(options.certbotDir ? resolve(options.certbotDir) : join(stateDir, 'certbot')).workDir);
  let nginx: NginxProcess | undefined;
  let confDir: string;
  let mainConfPath: string;
  let test: NginxLoopOptions['test'];
  let reload: NginxLoopOptions['reload'];
  if (options.nginx === 'private') {
    const prefix = join(stateDir, 'nginx');
    const paths = await writeMainConf(prefix, {
      ...(options.sitesDir ? { confDir: resolve(options.sitesDir) } : {}),
      user: worker?.user ?? null,
      tempDir: workerDirs.tempDir,
      unixListeners: [internal.socketPath],
    });
    confDir = paths.confDir;
    mainConfPath = paths.confPath;
    nginx = new NginxProcess({
      paths,
      nginxBin: options.nginxBin,
      logger: logger.child({ component: 'nginx' }),
      // A master that died or came back: a pass reports it and re-applies what a failed reload rolled back.
      onEvent: (e) => {
        if ((e.type === 'exited' && !e.expected) || e.type === 'restart-failed' || (e.type === 'started' && nginx?.info.lastExit)) controller.notify();
      },
    });
    test = (conf) => testConfig(conf, paths.prefix, { nginxBin: options.nginxBin });
    reload = () => nginx!.reload();
  } else {
    confDir = resolve(options.sitesDir!);
    await mkdir(join(confDir, 'sites'), { recursive: true });
    mainConfPath = resolve(options.nginxConf);
    const system = systemNginx({ reloadCommand: options.reloadCommand, testCommand: options.testCommand, nginxConf: mainConfPath });
    test = (conf) => system.test(conf);
    reload = () => system.reload();
    // A file left by a system Nginx that died would make its next reload fail.
    await removeStaleSocket(internal.socketPath);
  }

  // 3. Loops and the controller.
  const apiTarget = (port: number): string =>
    `http://${urlHost(options.apiHost === '0.0.0.0' || options.apiHost === '::' ? '127.0.0.1' : options.apiHost)}:${port}`;
  // Read at every pass; with --api-port 0 the real port is filled in once the API listens.
  const view: NginxLoopOptions['view'] = {
    httpPort: options.httpPort,
    httpsPort: options.httpsPort,
    listenHost: options.listenHost,
    apiUrl: apiTarget(options.apiPort),
    proxyReadTimeoutSec: Math.round(options.proxyReadTimeout),
    acmeWebroot,
    accessLogPath: accessLog,
    internalSocket: internal.socketPath,
    entrypointKeyInclude: internal.keyInclude,
  };
  const sshLoop = createSshLoop({
    stateDir,
    socketDir: workerDirs.socketDir,
    ...(workerDirs.gid !== null ? { socketGid: workerDirs.gid, socketMode: 0o660 } : {}),
    keepaliveIntervalMs: options.sshKeepaliveInterval * 1000,
    keepaliveCountMax: options.sshKeepaliveCountMax,
    drainMs: options.drainPeriod * 1000,
    // A removed service's socket stays until Nginx has stopped routing to it.
    routedBy: NGINX_LOOP,
    ...(deps.ssh ?? {}),
  });
  const tlsLoop = createTlsLoop({
    stateDir,
    acmeWebroot,
    certbotBin: options.certbotBin,
    timeoutMs: options.certbotTimeout * 1000,
    dnsPreflight: options.dnsPreflight === 'true',
    ...(options.certbotDir ? { certbotDirs: certbotDirsUnder(resolve(options.certbotDir)) } : {}),
    ...(options.acmeCaBundle ? { env: { REQUESTS_CA_BUNDLE: resolve(options.acmeCaBundle) } } : {}),
    ...(deps.resolve ? { resolve: deps.resolve } : {}),
  });
  const nginxLoop = createNginxLoop({
    confDir,
    mainConfPath,
    test,
    reload,
    view,
    certFor: certForFromStatus(tlsLoop.certsDir),
    // Every service's upstream is its balancer socket: replica changes need no reload.
    upstreamFor: (service) => ({ kind: 'socket', path: sshLoop.balancer.socketPathFor(serviceKey(service)) }),
    dependsOn: [TLS_LOOP, SSH_LOOP],
    // Certificates come from the TLS loop's status; the SSH loop only has to have bound the
    // sockets first (its tunnels' ups and downs, a retired socket closing, change no site).
    triggeredBy: [TLS_LOOP],
    ...(deps.renderHook ? { renderHook: deps.renderHook } : {}),
    ...(nginx ? { supervisor: () => nginx!.info } : {}),
    currentGeneration: () => current.generation,
    minReloadIntervalMs: DEFAULT_MIN_RELOAD_INTERVAL_MS,
    ...(deps.nginxLoop ?? {}),
  });
  const loops = [sshLoop, tlsLoop, nginxLoop] as unknown as AnyLoop[];
  const controller = new Controller({
    loops,
    getSpec: () => ({ state: current.state, generation: current.generation }),
    resyncIntervalMs: options.resyncInterval * 1000,
    logger: logger.child({ component: 'controller' }),
    ...(deps.clock ? { clock: deps.clock } : {}),
  });

  // 4. The API: listening before the first pass, so /readyz can say "not yet".
  let ready = false;
  const runtime: Runtime = {
    store,
    plan: (next, base) =>
      planFromController(
        controller,
        next,
        base,
        (loop, kinds) => (loop === NGINX_LOOP ? { reload: kinds.some((k) => k !== 'conflict') } : undefined),
      ),
    notify() {
      // A failed read must not become an unhandled rejection (fatal in Node): log it; the next
      // write or a restart reads the stored document again.
      store
        .read()
        .then(async (s) => {
          current = s;
          controller.notify();
          await observeModels(firstSeen, s.state, Math.floor(Date.now() / 1000));
        })
        .catch((err: unknown) => logger.error({ err }, 'reading the state after a write failed'));
    },
    status: () => controller.statuses(),
    isReady: () => ready,
  };
  // Request-path services: auth_request target, stats for the autoscaler, metrics.
  const auth = options.serverUrl
    ? createControlServerAuth({
        serverUrl: options.serverUrl,
        ttlMs: options.authCacheTtl * 1000,
        timeoutMs: options.authTimeout * 1000,
        logger: logger.child({ component: 'auth' }),
        ...(deps.clock ? { clock: deps.clock } : {}),
      })
    : noServerAuth;
  // Model calls go through our own Nginx with the service's Host: load-balanced, rate-limited
  // per client and counted like any other request, on the internal listener (no auth_request
  // there: the model API checks the token itself).
  const modelForwarder = nginxForwarder({ socketPath: internal.socketPath });
  const firstSeen = fileFirstSeenStore(join(stateDir, 'models.json'));
  await observeModels(firstSeen, current.state, Math.floor(Date.now() / 1000));
  const stats = createStatsCollector({ accessLogPath: accessLog, logger: logger.child({ component: 'stats' }) });
  const metrics = createMetrics({
    loops: () => controller.counters(),
    nginx: () => ({ ...nginxLoop.stats, ...(nginx ? { restarts: nginx.info.restarts, staleStopped: nginx.info.staleStopped } : {}) }),
    nginxConfigHash: () => nginxLoop.stats.configHash,
    generation: () => current.generation,
    services: () => stats.totals(current.state),
    accessLog: () => stats.counters(),
    tunnels: () => tunnelMetrics(controller.statuses(), sshLoop),
    certificates: () => certificateMetrics(current.state, tlsLoop),
  });
  const app = await buildApp({
    runtime,
    logger: logger.child({ component: 'api' }),
    ...(apiToken ? { apiToken } : {}),
    routes: [
      // Nginx calls the auth target for every request: never behind the API token, and for
      // this host only (an API beyond loopback must not be a token oracle for the network).
      async (a) =>
        a.register(async (scope) => {
          scope.addHook('onRequest', thisHostOnly);
          await scope.register(authRoutes, { auth });
        }),
      // Stats and metrics list every project, service, replica and domain: management data.
      async (a, guard) => a.register(statsRoutes, { collector: stats, getState: async () => current.state, guard }),
      async (a, guard) => a.register(metricsRoutes, { metrics, guard }),
      // The OpenAI-compatible API; entrypoint sites proxy here. Always token-checked.
      async (a) =>
        registerModelApi(a, {
          prefix: '/api/models/:project',
          getState: () => current.state,
          authorize: (project, token) => auth.check(project, token),
          forward: (service, request) => modelForwarder.forward(service, request),
          // Behind an entrypoint site the client is who Nginx saw; called directly, the peer.
          clientOf: entrypointClient(internal.key),
          firstSeen,
          ...(deps.clock ? { clock: deps.clock } : {}),
        }),
    ],
  });

  const close = async (): Promise<void> => {
    await app.close();
    await stats.stop();
    await auth.close();
    await modelForwarder.close();
    await controller.stop();
    await sshLoop.close();
    await nginx?.stop();
    await store.close();
  };

  try {
    await nginx?.start();
    stats.start();
    const address = await app.listen({ host: options.apiHost, port: options.apiPort });
    logger.info({ address, generation: current.generation, nginx: options.nginx, confDir }, 'gateway listening');
    const port = (app.server.address() as { port: number }).port;
    view.apiUrl = apiTarget(port);
    // 5. The first pass: adopts files already correct, writes the rest, reloads at most once.
    //    Ready once every loop has settled it: Nginx serves the document; certificates still
    //    being requested (DNS not there yet, certbot running) arrive later on their own.
    const first = controller.start();
    await controller.whenSettled();
    ready = true;
    logger.info({ generation: current.generation }, 'first reconcile pass settled');
    void first.then(() => logger.info({ generation: current.generation }, 'first reconcile pass finished'));
    return {
      app,
      controller,
      store,
      apiUrl: `http://${urlHost(options.apiHost)}:${port}`,
      nginxStats: nginxLoop.stats,
      ssh: sshLoop,
      nginx,
      paths: { stateDir, confDir, accessLog, acmeWebroot },
      close,
    };
  } catch (err) {
    await close().catch(() => undefined);
    throw err;
  }
}


function tunnelMetrics(statuses: StatusSnapshot, ssh: SshLoop): TunnelMetric[] {
  const out: TunnelMetric[] = [];
  for (const [key, { conditions }] of Object.entries(statuses.loops[SSH_LOOP]?.objects ?? {})) {
    const ready = conditions.find((c) => c.type === 'Ready');
    const slash = key.lastIndexOf('/');
    const replica = key.slice(slash + 1);
    out.push({
      service: key.slice(0, slash),
      replica,
      state: ready?.status === 'True' ? 'Ready' : (ready?.reason ?? 'Unknown'),
      reconnects: Math.max(0, ssh.connects(replica) - 1),
    });
  }
  return out;
}

function certificateMetrics(state: ProxyState, tls: TlsLoop): CertificateMetric[] {
  const domains = [...state.spec.services, ...state.spec.entrypoints].filter((o) => o.https && o.domain).map((o) => o.domain!);
  return domains.map((domain) => {
    const info = tls.domainInfo(domain);
    return { domain, notAfter: info?.cert ? info.cert.notAfter : null, failedAttempts: info?.failedAttempts ?? 0 };
  });
}

function certbotDirsUnder(dir: string): { configDir: string; workDir: string; logsDir: string } {
  return { configDir: join(dir, 'config'), workDir: join(dir, 'work'), logsDir: join(dir, 'logs') };
}

/** Where the gateway reaches its own Nginx: the listen address, or loopback for a wildcard. */
function urlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}
