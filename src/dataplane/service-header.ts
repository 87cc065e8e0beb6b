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
   * and the replica's own CORS headers are dropped (the default server adds the site's).
   */
  readonly cors: boolean;
  /**
   * `auth: true`: only a request Nginx's by-host auth check passed for this very service (its
   * AUTH_STAMP_HEADER names it) goes on, without the client's Authorization.
   */
  readonly auth: boolean;
}

/** Whether two routes serve a host alike. */
export function sameRoute(a: HostRoute | undefined, b: HostRoute | undefined): boolean {
  return a === b || (a !== undefined && b !== undefined && a.host === b.host && a.cors === b.cors && a.auth === b.auth);
}

/**
 * Set by our default server from its by-host auth check: the service key whose token check the
 * request passed (a client's own header of this name is replaced, or removed when the check
 * named none). Never reaches a replica.
 */
export const AUTH_STAMP_HEADER = 'X-Dstack-Proxy-Auth';

/**
 * What the data plane answers a by-host request for a host it has no route for: Nginx's own
 * default-server 404, through this named location (X-Accel-Redirect), which logs nothing.
 */
export const UNKNOWN_HOST_LOCATION = '@dstack_unknown_host';

/** The client's method, on the default server's by-host check (hostCheck); its Host is the client's. */
export const HOST_AUTH_METHOD_HEADER = 'X-Dstack-Proxy-Method';
/** Answer headers of the check: the service whose token check passed (the stamp), a model's CORS origin. */
export const HOST_AUTH_SERVICE_HEADER = 'X-Dstack-Proxy-Auth-Service';
export const HOST_AUTH_CORS_HEADER = 'X-Dstack-Proxy-Cors';

/** The SERVICE_HEADER value of the default server's by-host check (hostCheck): never a service key. */
export const HOST_CHECK = 'host-check';
