// `GET /api/stats/collect`: dstack's autoscaler input, in dstack's format
// `[{project_name, run_name, stats: {"30": {requests, request_time}, "60": …, "300": …}}]`.

import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import type { ProxyState } from '../spec/types.js';
import type { ServiceStats } from '../stats/index.js';

export interface StatsRoutesOptions {
  collector: { collect(state: ProxyState): Promise<ServiceStats[]> };
  /** The current document (the runtime's store). */
  getState: () => Promise<ProxyState> | ProxyState;
  /** Optional onRequest guard (e.g. the API token). */
  guard?: (request: FastifyRequest) => Promise<void>;
}

export const statsRoutes: FastifyPluginAsync<StatsRoutesOptions> = async (app, { collector, getState, guard }) => {
  app.get('/api/stats/collect', guard ? { onRequest: guard } : {}, async (_req, reply) => {
    const stats = await collector.collect(await getState());
    return reply.header('cache-control', 'no-store').send(stats);
  });
};
