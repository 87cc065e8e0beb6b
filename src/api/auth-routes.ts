// GET /api/auth/:project, Nginx's auth_request target, over the control-server check.

import type { FastifyPluginAsync } from 'fastify';
import { bearerToken } from '../auth/bearer.js';
import type { AuthProvider } from '../auth/control-server.js';

export interface AuthRoutesOptions {
  auth: AuthProvider;
}

/**
 * `GET /api/auth/:project`, the Nginx auth_request target: 200 member, 401 no or malformed
 * token, 403 not a member, 503 when the server could not say (Nginx turns any status but
 * 2xx/401/403 into a 500 for the client: the request is refused either way).
 */
export const authRoutes: FastifyPluginAsync<AuthRoutesOptions> = async (app, { auth }) => {
  app.get<{ Params: { project: string } }>('/api/auth/:project', async (req, reply) => {
    void reply.header('cache-control', 'no-store');
    const token = bearerToken(req.headers.authorization);
    const decision = token === null ? 'unauthenticated' : await auth.check(req.params.project, token);
    switch (decision) {
      case 'allow':
        return reply.code(200).send();
      case 'unauthenticated':
        return reply.code(401).header('www-authenticate', 'Bearer').send({ detail: 'Not authenticated' });
      case 'deny':
        // dstack's gateway's words for a refused token.
        return reply.code(403).send({ detail: `Unauthenticated or unauthorized to access project ${req.params.project}` });
      case 'unavailable':
        return reply.code(503).send({ detail: 'The control server could not verify the token' });
    }
  });
};
