// The gateway's HTTP API, built apart from listening: tests call app.inject().

import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { ProxyError } from '../errors.js';
import { hasDuplicateHost } from '../http1/index.js';
import { MAX_DOCUMENT_BYTES } from '../spec/index.js';
import { statusPageRoutes } from './status-page.js';
import { tokenGuard } from './api-token.js';
import { installErrorHandlers } from './errors.js';
import type { Runtime } from './runtime.js';
import { stateRoutes } from './state-routes.js';
import { sortedObjects } from '../reconcilers/status.js';
import type { LoopStatus, ObjectStatus } from '../reconcilers/types.js';

/** A route module: registers itself on the app, behind `guard` when it serves management data. */
export type RouteModule = (app: FastifyInstance, guard: (request: FastifyRequest) => Promise<void>) => Promise<void>;

export interface AppOptions {
  runtime: Runtime;
  /**
   * Protects the management routes when set: /api/v1/*, and whatever the `routes` below put
   * behind the guard they are given (stats, metrics).
   */
  apiToken?: string;
  /**
   * Serve the management routes (/api/v1/state, /api/v1/status). Default true; false for a
   * public listener whose management routes live on another, loopback one.
   */
  management?: boolean;
  logger?: Logger | false;
  /** More fields for GET /api/v1/status (the in-server proxy adds its store's health). */
  statusExtra?: () => Record<string, unknown>;
  /**
   * Per loop, per object key, fields added to that object in GET /api/v1/status, read at each
   * request (the loops' liveStatus(): requests in flight per replica).
   */
  liveStatus?: () => Record<string, Readonly<Record<string, Readonly<Record<string, unknown>>>>>;
  /** More routes (auth, stats, metrics, models): each registers itself on the app. */
  routes?: RouteModule[];
  /**
   * Requests this host's Nginx proxies to the API carry `header` (the gateway's entrypoint sites
   * send their key): such a request reaches the routes under `prefix` only (the model API) and
   * gets 403 anywhere else, whatever its path says once Nginx has rewritten it. Management,
   * stats and the dstack routes never answer a request that came from the internet.
   */
  proxied?: { header: string; prefix: string };
  /**
   * Requests still answered while the app closes (Fastify's 503 otherwise): connections handed
   * to its server after its port closed (the gateway's data plane gives it the model API's) are
   * served until the process ends.
   */
  serveWhileClosing?: boolean;
}

/**
 * The loops' statuses as answered: objects copied and sorted by key (the snapshot's are a live
 * view), with the live fields added to the objects they name.
 */
function withLiveStatus(
  loops: Record<string, LoopStatus>,
  live: Record<string, Readonly<Record<string, Readonly<Record<string, unknown>>>>> | undefined,
): Record<string, LoopStatus> {
  const out: Record<string, LoopStatus> = {};
  for (const [name, loop] of Object.entries(loops)) {
    const objects: Record<string, ObjectStatus> = sortedObjects(loop.objects);
    for (const [key, fields] of Object.entries(live?.[name] ?? {})) {
      const o = objects[key];
      if (o !== undefined) objects[key] = { ...fields, ...o };
    }
    out[name] = { ...loop, objects };
  }
  return out;
}

/** When this process started, ms since the epoch. */
const STARTED_AT = Math.round(performance.timeOrigin);

export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { runtime } = options;
  const app = Fastify({
    loggerInstance: (options.logger || undefined) as FastifyBaseLogger | undefined,
    bodyLimit: MAX_DOCUMENT_BYTES,
    logController: new LogController({ disableRequestLogging: true }),
    return503OnClosing: options.serveWhileClosing !== true,
  });
  installErrorHandlers(app);
  // Two Host headers make the target ambiguous (RFC 9112 §3.2): refused on every route, as Nginx does.
  app.addHook('onRequest', async (request, reply) => {
    if (hasDuplicateHost(request.raw.rawHeaders)) return reply.code(400).send(new ProxyError('DP_ERR_DUPLICATE_HOST').toJSON());
    return undefined;
  });
  const proxied = options.proxied;
  if (proxied !== undefined) {
    const header = proxied.header.toLowerCase();
    app.addHook('onRequest', async (request, reply) => {
      if (request.headers[header] === undefined || request.routeOptions.url?.startsWith(proxied.prefix)) return undefined;
      return reply
        .code(403)
        .send(new ProxyError('DP_ERR_FORBIDDEN', 'this route does not answer requests proxied from the sites').toJSON());
    });
  }
  const guard = tokenGuard(options.apiToken);

  if (options.management !== false) await app.register(stateRoutes, { runtime, guard });
  for (const register of options.routes ?? []) await register(app, guard);

  if (options.management !== false)
    app.get('/api/v1/status', { onRequest: guard }, async () => {
      const current = await runtime.store.read();
      const snapshot = runtime.status();
      return {
        generation: current.generation,
        hash: current.hash,
        ready: runtime.isReady(),
        // The newest generation every loop has acted on, not just the one stored.
        observedGeneration: snapshot.observedGeneration ?? snapshot.generation,
        ...options.statusExtra?.(),
        loops: withLiveStatus(snapshot.loops, options.liveStatus?.()),
      };
    });
  if (options.management !== false) await app.register(statusPageRoutes, { guard, tokenSet: options.apiToken !== undefined });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_request, reply) => {
    // startedAt: which process answered, for whoever waits for a new one (a hand-over).
    if (runtime.isReady()) return { status: 'ready', startedAt: STARTED_AT };
    return reply.code(503).send({ code: 'DP_ERR_NOT_READY', message: 'the first reconcile pass has not finished' });
  });
  return app;
}
