// Who may call a protected service: the bearer token of a request and the control server's answer
// for it, shared by the Nginx auth target, the model API and the in-server proxy.

export { bearerToken } from './bearer.js';
export {
  cacheKey,
  createControlServerAuth,
  DEFAULT_AUTH_CACHE_ENTRIES,
  DEFAULT_AUTH_TIMEOUT_MS,
  DEFAULT_AUTH_TTL_MS,
  noServerAuth,
} from './control-server.js';
export type { AuthDecision, AuthProvider, ControlServerAuthOptions } from './control-server.js';
