// What a service's site does beyond the relay, done by the data plane for a host our default
// server relays by Host (before that site is served): check the token of an `auth: true` service
// with the control server, and give an OpenAI-format model's endpoint its CORS. The answers are
// the site's: 401/403/503 with the auth target's words, a preflight answered with 204, the CORS
// headers on every answer, and none of these counted as a replica hit (HIT_HEADER). A site's own
// token check (its auth_request, AUTH_CHECK_PREFIX) is answered here too, with the status alone.

import { STATUS_CODES } from 'node:http';
import { MODEL_CORS_HEADERS, MODEL_CORS_METHODS, MODEL_CORS_ORIGIN } from '../spec/cors.js';
import { detailBody } from './detail.js';
import { HIT_HEADER } from './service-header.js';

export type HostDecision = 'allow' | 'deny' | 'unauthenticated' | 'unavailable';

/** What the control server says of a request's `Authorization` (absent: undefined) for a project. */
export type HostAuthorize = (project: string, authorization: string | undefined) => Promise<HostDecision>;

/** The model CORS headers, as lines of a response head. */
export const CORS_LINES =
  `Access-Control-Allow-Origin: ${MODEL_CORS_ORIGIN}\r\n` +
  `Access-Control-Allow-Methods: ${MODEL_CORS_METHODS}\r\n` +
  `Access-Control-Allow-Headers: ${MODEL_CORS_HEADERS}\r\n`;

const NOT_A_HIT = `${HIT_HEADER}: 0\r\n`;

/** The whole answer to a model's preflight: no body, no replica asked. */
export function preflightAnswer(keepAlive: boolean): string {
  return `HTTP/1.1 204 No Content\r\n${CORS_LINES}${NOT_A_HIT}${keepAlive ? '' : 'Connection: close\r\n'}\r\n`;
}

/** The whole answer to a request the token check refused, with the auth target's words. */
export function refusalAnswer(decision: Exclude<HostDecision, 'allow'>, project: string, cors: boolean, keepAlive: boolean): string {
  const [status, detail, extra] =
    decision === 'unauthenticated'
      ? [401, 'Not authenticated', 'WWW-Authenticate: Bearer\r\n']
      : decision === 'deny'
        ? [403, `Unauthenticated or unauthorized to access project ${project}`, '']
        : [503, 'The control server could not verify the token', ''];
  const body = detailBody(detail);
  return (
    `HTTP/1.1 ${status} ${STATUS_CODES[status]!}\r\n${extra}${cors ? CORS_LINES : ''}${NOT_A_HIT}` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
    `${keepAlive ? '' : 'Connection: close\r\n'}\r\n${body}`
  );
}

/** The answer to a site's token check (auth_request): its status is all Nginx reads, and 401's WWW-Authenticate. */
export function checkAnswer(decision: HostDecision, keepAlive: boolean): string {
  const close = keepAlive ? '' : 'Connection: close\r\n';
  switch (decision) {
    case 'allow':
      return `HTTP/1.1 200 OK\r\nContent-Length: 0\r\n${close}\r\n`;
    case 'unauthenticated':
      return `HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Length: 0\r\n${close}\r\n`;
    case 'deny':
      return `HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n${close}\r\n`;
    case 'unavailable':
      return `HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n${close}\r\n`;
  }
}
