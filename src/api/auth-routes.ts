// GET /api/auth/:project, Nginx's auth_request target, over the control-server check.

import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import { bearerToken } from '../auth/bearer.js';
import type { AuthDecision, AuthProvider } from '../auth/control-server.js';

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
    return sendDecision(reply, await tokenDecision(auth, req.params.project, req.headers.authorization), req.params.project);
  });
};

/** What the control server says of the request's `Authorization` for `project`. */
export async function tokenDecision(auth: AuthProvider, project: string, authorization: string | undefined): Promise<AuthDecision> {
  const token = bearerToken(authorization);
  return token === null ? 'unauthenticated' : auth.check(project, token);
}

/** An auth_request target's answer to a decision: 200, 401, 403, or 503 when nobody could say. */
export function sendDecision(reply: FastifyReply, decision: AuthDecision, project: string): FastifyReply {
  switch (decision) {
    case 'allow':
      return reply.code(200).send();
    case 'unauthenticated':
      return reply.code(401).header('www-authenticate', 'Bearer').send({ detail: 'Not authenticated' });
    case 'deny':
      // dstack's gateway's words for a refused token.
      return reply.code(403).send({ detail: `Unauthenticated or unauthorized to access project ${project}` });
    case 'unavailable':
      return reply.code(503).send({ detail: 'The control server could not verify the token' });
  }
}
