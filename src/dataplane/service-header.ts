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
 * What the data plane answers a by-host request for a host it has no route for: Nginx's own
 * default-server 404, through this named location (X-Accel-Redirect), which logs nothing.
 */
export const UNKNOWN_HOST_LOCATION = '@dstack_unknown_host';
