// Optional bearer token for the management routes (state, status). Compared in constant time.

import { createHash, timingSafeEqual } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
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

/** Read --api-token-file: at least 16 characters; warns when the file is readable by others. */
export async function readApiToken(file: string, logger: Logger): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `cannot read --api-token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
  const token = text.trim();
  if (token.length < 16) throw new ProxyError('DP_ERR_BAD_OPTION', `--api-token-file ${file}: the token must be at least 16 characters`);
  if (((await stat(file)).mode & 0o077) !== 0) logger.warn({ file }, 'the API token file is readable by group or others; chmod 600 it');
  return token;
}
