export { registerServerProxy, type ServerProxy, type ServerProxyOptions } from './plugin.js';
export { createInProcessStats, type InProcessStats } from './stats.js';
export { RateLimiter, longestPrefix } from './rate-limit.js';
export { downstreamRawHeaders, downstreamResponseHeaders, upstreamRequestHeaders, HOP_BY_HOP } from './headers.js';
export { parseProxyTarget, upstreamTarget, SERVICES_PREFIX } from './paths.js';
export type { Authorize } from './admit.js';
export type { ReplicaRouter } from '../dataplane/router.js';
