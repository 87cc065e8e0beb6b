// The request header that names the service on the shared data-plane socket. Nginx sets it in
// each service site (proxy_set_header replaces whatever a client sent under that name), the relay
// reads it per request and takes it off before the request goes to a replica.

export const SERVICE_HEADER = 'X-Dstack-Proxy-Service';

/** The shared socket's file name under the balancer's socket dir. */
export const SHARED_SOCKET_NAME = 'dataplane.sock';

/**
 * The SERVICE_HEADER value of our default server: the service is the one whose by-host route
 * (Replicas.setHostRoute) names the request's Host. Nginx serves a new service this way from the
 * moment the data plane has it, before the reload that brings its own site in. Never a service
 * key: those have a slash.
 */
export const BY_HOST = 'by-host';

/**
 * How the data plane serves a host our default server relays (Replicas.setHostRoute): what the
 * service's own site would do beyond the relay, done here until that site is served.
 */
export interface HostRoute {
  /** The host, lower case, as Nginx's $host. */
  readonly host: string;
  /**
   * An OpenAI-format model's CORS: a preflight (OPTIONS) is answered here, never by a replica,
   * and every answer carries the site's CORS headers in place of the replica's.
   */
  readonly cors: boolean;
  /**
   * `auth: true`: a request goes on only once the control server has passed its token for the
   * service's project, and without its Authorization, as the site's auth_request would do.
   */
  readonly auth: boolean;
}

/** Whether two routes serve a host alike. */
export function sameRoute(a: HostRoute | undefined, b: HostRoute | undefined): boolean {
  return a === b || (a !== undefined && b !== undefined && a.host === b.host && a.cors === b.cors && a.auth === b.auth);
}

/**
 * What the data plane answers a by-host request for a host it has no route for: Nginx's own
 * default-server 404, through this named location (X-Accel-Redirect), which logs nothing.
 */
export const UNKNOWN_HOST_LOCATION = '@dstack_unknown_host';

/**
 * On the data plane's own answer to a by-host request (a refused token, a preflight): what a
 * service site would not count as a replica hit. The default server logs it so, and hides it.
 */
export const HIT_HEADER = 'X-Dstack-Proxy-Hit';

/**
 * The SERVICE_HEADER value of a service site's token check (its auth_request), followed by the
 * project: answered by the data plane with the control server's word (200, 401, 403, 503), on
 * the same kept-alive socket as the requests, which a take-over moves without a gap.
 */
export const AUTH_CHECK_PREFIX = 'auth-check:';

/**
 * The SERVICE_HEADER value of an entrypoint site's request for the gateway's model API: the
 * data plane gives the whole connection to the API's HTTP server (ModelApiHandOff). The site
 * reaches the socket without a keep-alive pool, so each such connection carries one request.
 * Through this socket rather than the API's TCP port, a take-over or a restart moves it with
 * the rest of the data plane, without a gap.
 */
export const MODEL_API = 'model-api';
