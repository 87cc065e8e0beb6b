// The by-host auth check: our default server relays a host without a site of its own to the
// data plane, and asks this first (auth_request) what the host's service would have its site
// do: check the token of an `auth: true` service, add an OpenAI-format model's CORS. The answer
// names the service a token passed for; the data plane serves such a service only to a request
// that carries its name, so a document that changed between the check and the relay is
// refused, never served unchecked.

import type { FastifyPluginAsync } from 'fastify';
import { sendDecision, tokenDecision } from '../api/auth-routes.js';
import type { AuthProvider } from '../auth/control-server.js';
import {
  HOST_AUTH_CORS_HEADER,
  HOST_AUTH_HOST_HEADER,
  HOST_AUTH_METHOD_HEADER,
  HOST_AUTH_PATH,
  HOST_AUTH_SERVICE_HEADER,
} from '../dataplane/service-header.js';
import { byHostEligible, servesCors } from '../reconcilers/ssh/host-routes.js';
import { serviceKey, type ProxyState, type Service } from '../spec/types.js';

export interface HostAuthOptions {
  auth: AuthProvider;
  /** The current document. */
  getState: () => ProxyState;
}

const byDomain = new WeakMap<readonly Service[], ReadonlyMap<string, Service>>();

/** The services our default server may relay, by domain; once per services list. */
function relayedByDomain(services: readonly Service[]): ReadonlyMap<string, Service> {
  let out = byDomain.get(services);
  if (out === undefined) {
    const m = new Map<string, Service>();
    for (const s of services) if (byHostEligible(s)) m.set(s.domain!.toLowerCase(), s);
    byDomain.set(services, (out = m));
  }
  return out;
}

const HOST_LOWER = HOST_AUTH_HOST_HEADER.toLowerCase();
const METHOD_LOWER = HOST_AUTH_METHOD_HEADER.toLowerCase();

/**
 * `GET HOST_AUTH_PATH`: 200 for a host whose service needs no token (or no service: the data
 * plane then answers the unknown host's 404), with the service named once its token passed;
 * 401/403/503 as `GET /api/auth/:project`. A model's host gets its CORS origin whatever the
 * token says (its site adds CORS to a 401 too), and its preflight needs no token.
 */
export const hostAuthRoutes: FastifyPluginAsync<HostAuthOptions> = async (app, o) => {
  app.get(HOST_AUTH_PATH, async (req, reply) => {
    void reply.header('cache-control', 'no-store');
    const host = req.headers[HOST_LOWER];
    const s = typeof host === 'string' ? relayedByDomain(o.getState().spec.services).get(host.toLowerCase()) : undefined;
    if (s === undefined) return reply.code(200).send();
    const cors = servesCors(s);
    if (cors) void reply.header(HOST_AUTH_CORS_HEADER, '*');
    if (!s.auth || (cors && req.headers[METHOD_LOWER] === 'OPTIONS')) return reply.code(200).send();
    const decision = await tokenDecision(o.auth, s.project, req.headers.authorization);
    if (decision === 'allow') void reply.header(HOST_AUTH_SERVICE_HEADER, serviceKey(s));
    return sendDecision(reply, decision, s.project);
  });
};
