// Every error response is JSON {code, message, …} from the catalog in src/errors.ts.

import type { FastifyError, FastifyInstance } from 'fastify';
import { ProxyError } from '../errors.js';

export function installErrorHandlers(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | ProxyError, request, reply) => {
    if (err instanceof ProxyError) {
      if (err.status >= 500) request.log.error({ err }, err.message);
      return reply.code(err.status).send(err.toJSON());
    }
    const mapped = mapFastifyError(err);
    if (mapped.status >= 500) request.log.error({ err }, 'request failed');
    return reply.code(mapped.status).send(mapped.toJSON());
  });
  app.setNotFoundHandler((request, reply) =>
    reply.code(404).send(new ProxyError('DP_ERR_NOT_FOUND', `no route ${request.method} ${request.url.split('?')[0]}`).toJSON()),
  );
}

function mapFastifyError(err: FastifyError): ProxyError {
  switch (err.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ProxyError('DP_ERR_DOCUMENT_TOO_LARGE', 'the body is larger than 16 MiB');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ProxyError('DP_ERR_UNSUPPORTED_MEDIA_TYPE', 'send application/json or application/yaml');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new ProxyError('DP_ERR_MALFORMED_DOCUMENT', err.message);
    default:
      if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500) {
        return new ProxyError('DP_ERR_MALFORMED_DOCUMENT', err.message);
      }
      return new ProxyError('DP_ERR_INTERNAL');
  }
}
