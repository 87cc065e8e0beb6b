// Optional bearer token for the management routes (state, status). Compared in constant time.

import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { ProxyError } from '../errors.js';

export function tokenGuard(token: string | undefined): (request: FastifyRequest) => Promise<void> {
  if (token === undefined) return async () => {};
  const expected = digest(token);
  return async (request) => {
    const header = request.headers.authorization;
    const given = header?.startsWith('Bearer ') ? header.slice(7).trim() : undefined;
    if (given === undefined || !timingSafeEqual(digest(given), expected)) {
      throw new ProxyError('DP_ERR_UNAUTHORIZED', 'send the API token as Authorization: Bearer <token>');
    }
  };
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}
