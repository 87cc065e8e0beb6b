// The gateway's HTTP API, built apart from listening: tests call app.inject().

import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { MAX_DOCUMENT_BYTES } from '../spec/index.js';
import { tokenGuard } from './api-token.js';
import { installErrorHandlers } from './errors.js';
import type { Runtime } from './runtime.js';
import { stateRoutes } from './state-routes.js';

export interface AppOptions {
  runtime: Runtime;
  /** Protects the management routes (/api/v1/*) when set. */
  apiToken?: string;
  logger?: Logger | false;
  /** More fields for GET /api/v1/status (the in-server proxy adds its store's health). */
  statusExtra?: () => Record<string, unknown>;
  /** More routes (auth, stats, metrics, models): each registers itself on the app. */
  routes?: ((app: FastifyInstance, guard: (request: FastifyRequest) => Promise<void>) => Promise<void>)[];
}

export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { runtime } = options;
  const app = Fastify({
    loggerInstance: (options.logger || undefined) as FastifyBaseLogger | undefined,
    bodyLimit: MAX_DOCUMENT_BYTES,
    logController: new LogController({ disableRequestLogging: true }),
  });
  installErrorHandlers(app);
  const guard = tokenGuard(options.apiToken);

  await app.register(stateRoutes, { runtime, guard });
  for (const register of options.routes ?? []) await register(app, guard);

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
      loops: snapshot.loops,
    };
  });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_request, reply) => {
    if (runtime.isReady()) return { status: 'ready' };
    return reply.code(503).send({ code: 'DP_ERR_NOT_READY', message: 'the first reconcile pass has not finished' });
  });
  return app;
}
