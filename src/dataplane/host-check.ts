// The by-host check our default server asks (auth_request) before it relays a host without a
// site of its own, answered on the data-plane socket like any request, from the by-host routes:
// what the host's service would have its site do — check the token of an `auth: true` service,
// add an OpenAI-format model's CORS — and nothing for any other host. It runs before every such
// request, so the common answer (a public host, or none) is one string written at once.

import { sameLower } from '../http1/field.js';
import type { Replicas } from './replicas.js';
import { HOST_AUTH_CORS_HEADER, HOST_AUTH_METHOD_HEADER, HOST_AUTH_SERVICE_HEADER } from './service-header.js';

/** What the control server says of a request's `Authorization` (absent: undefined) for a project. */
export type HostAuthorize = (
  project: string,
  authorization: string | undefined,
) => Promise<'allow' | 'deny' | 'unauthenticated' | 'unavailable'>;

const PASS = 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n';
const CORS = `${HOST_AUTH_CORS_HEADER}: *\r\n`;
const REFUSED = {
  unauthenticated: 'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Length: 0\r\n',
  deny: 'HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n',
  unavailable: 'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n',
} as const;
const METHOD_LOWER = HOST_AUTH_METHOD_HEADER.toLowerCase();

/**
 * The answer to a check, its head without the blank line that ends it (the caller adds its
 * connection handling). 200 for a host whose service needs no token, or that has none (the
 * relay then answers the unknown host); 200 naming the service once its token passed; 401, 403
 * or 503 (nobody could say) as the site's auth_request would get them. A model's host is given
 * its CORS whatever the token says (its site adds CORS to a 401 too); its preflight needs none.
 */
export function hostCheck(
  replicas: Replicas,
  host: string,
  raw: readonly string[],
  authorize: HostAuthorize | undefined,
): string | Promise<string> {
  const routed = replicas.routeForHost(host);
  if (routed === undefined) return PASS;
  const { serviceKey, route } = routed;
  const cors = route.cors ? CORS : '';
  if (!route.auth || (route.cors && headerValue(raw, METHOD_LOWER) === 'OPTIONS')) return PASS + cors;
  if (authorize === undefined) return REFUSED.unavailable + cors;
  const project = serviceKey.slice(0, serviceKey.indexOf('/'));
  return authorize(project, headerValue(raw, 'authorization')).then(
    (decision) => (decision === 'allow' ? `${PASS}${HOST_AUTH_SERVICE_HEADER}: ${serviceKey}\r\n` : REFUSED[decision]) + cors,
    () => REFUSED.unavailable + cors,
  );
}

/** The first value of header `lower` (a lower-case name) in `raw`. */
function headerValue(raw: readonly string[], lower: string): string | undefined {
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === lower.length && sameLower(name, 0, lower)) return raw[i + 1];
  }
  return undefined;
}
