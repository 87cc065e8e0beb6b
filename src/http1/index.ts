// A lean HTTP/1.1 client for upstreams reached through any Duplex (see pool.ts for the rules).
export {
  Http1Pool,
  DEFAULT_HTTP1_TIMEOUT_MS,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS,
  type Http1PoolOptions,
} from './pool.js';
export { ResponseParser, ResponseParseError, DEFAULT_MAX_HEADER_SIZE, type ResponseSink } from './parser.js';
export { canResend } from './connection.js';
export { Http1Error, type Http1ErrorCode, type Http1Exchange, type Http1Handler, type Http1Request } from './types.js';
export { withErrorPath } from './streams.js';
export { hasDuplicateHost, headerObject } from './field.js';
