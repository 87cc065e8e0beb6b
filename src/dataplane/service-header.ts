// The request header that names the service on the shared data-plane socket. Nginx sets it in
// each service site (proxy_set_header replaces whatever a client sent under that name), the relay
// reads it per request and takes it off before the request goes to a replica.

export const SERVICE_HEADER = 'X-Dstack-Proxy-Service';

/** The shared socket's file name under the balancer's socket dir. */
export const SHARED_SOCKET_NAME = 'dataplane.sock';
