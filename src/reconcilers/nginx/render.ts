// View model → Nginx config text, one function per file kind. Pure: same view, same bytes.
//
// How a request flows through a service site (and what $dstack_replica_hit logs):
//   server level (rewrite phase): HTTP → HTTPS redirect, CORS preflight 204      → hit 0
//   location / of a router service (rewrite phase): a path outside the allowlist 403 → hit 0
//   location <prefix>: access phase (auth_request) → 401/403                      → hit 0
//                      preaccess phase (limit_req) → 429                          → hit 0
//                      try_files /nonexistent @dstack_replica (after both checks)
//   location @dstack_replica: `set $dstack_replica_hit 1`, then proxy_pass, or 503 when the
//                      service has no replica (counted as a hit, so autoscaling sees demand
//                      and can scale from zero).
// `set` runs in the rewrite phase, before access and limit_req; putting it in the named
// location that try_files enters after both is what keeps 401/429 out of the hit count.
// The default server's by-host relay logs a hit for every answer but those the data plane gives
// itself in the site's place (a refused token, a preflight), which it marks with HIT_HEADER.
//
// No address is trusted: a TLS terminator or an SSH forward on the gateway host makes every
// outside client 127.0.0.1. The gateway's own model API reaches a service through a second
// server on the internal listener (a Unix socket in a directory only the gateway can enter):
// that server has no auth_request (the model API checked the token) and no redirect, and takes
// the client's address from X-Real-IP, which only the gateway can send there.
//
// Load balancers the operator names (GlobalView.trustedProxies) are the one exception: their
// X-Forwarded-For and X-Forwarded-Proto are believed (trustedProxies below).

import {
  AUTH_CHECK_PREFIX,
  BY_HOST,
  HIT_HEADER,
  MODEL_API,
  SERVICE_HEADER,
  UNKNOWN_HOST_LOCATION,
} from '../../dataplane/service-header.js';
import { MODEL_CORS_HEADERS, MODEL_CORS_METHODS, MODEL_CORS_ORIGIN } from '../../spec/cors.js';
import { MARKER, quote } from './names.js';
import type { EntrypointSiteView, GlobalView, ServiceSiteView, SiteCommon, SiteView } from './view.js';

export { MARKER, fileNameFor, limitKeyVariable, quote, rateFor, upstreamName, zoneName } from './names.js';

export const UPSTREAM_KEEPALIVE = 64;
/**
 * Idle connections each worker keeps to the shared data-plane socket: one pool carries every
 * service's requests, so it is bigger than a site's, yet a bounded share of worker_connections
 * (4,096) whatever the number of services.
 */
export const DATAPLANE_KEEPALIVE = 1024;
export const UPSTREAM_KEEPALIVE_TIME = '1h';
export const LIMIT_REQ_ZONE_SIZE = '10m';
export const REPLICA_LOCATION = '@dstack_replica';
/** Where Nginx's own 504 (the replica silent past proxy_read_timeout) is answered in JSON. */
const TIMEOUT_LOCATION = '@dstack_timeout';
export const AUTH_LOCATION = '/_dstack_auth';
export const ACME_PREFIX = '/.well-known/acme-challenge/';
/**
 * The access log's format (src/stats/parse.ts reads its lines). Not `dstack_stat`: a host that
 * dstack's own gateway ran on keeps a sites file declaring a log_format of that name, and Nginx
 * refuses two log_formats of one name in the same http block.
 */
export const LOG_FORMAT = 'dstack_proxy_stat';
/** The same lines, from the default server's by-host relay: a hit unless the data plane says not. */
const BY_HOST_LOG_FORMAT = 'dstack_proxy_stat_by_host';

type Lines = string[];

function block(head: string, body: Lines): Lines {
  return [`${head} {`, ...body.map((l) => (l === '' ? '' : `    ${l}`)), '}'];
}

function text(lines: Lines): string {
  return `${lines.join('\n')}\n`;
}

/** The http-level file: log format, maps, default servers. */
export function renderGlobal(v: GlobalView): string {
  const l: Lines = [MARKER, '# dstack-proxy: http-level settings shared by every site.', ''];
  l.push(`log_format ${LOG_FORMAT} '$time_iso8601 $host $status $request_time $dstack_replica_hit';`, '');
  l.push('# 1 once a request reaches the location that proxies to a replica, 0 for answers given before');
  l.push('# (HTTPS redirect, 401/403 from auth, 429 from limit_req). Defined here so every server has it.');
  l.push(...block('map $host $dstack_replica_hit', ['default 0;']), '');
  l.push('# Upstream keepalive needs Connection "" on plain requests; WebSocket upgrades pass "upgrade".');
  l.push(...block('map $http_upgrade $dstack_connection_upgrade', ['default upgrade;', "'' '';"]), '');
  if (v.byHost) {
    l.push('# The by-host relay: what the data plane answers itself (a refused token, a preflight) is no hit.');
    l.push(`log_format ${BY_HOST_LOG_FORMAT} '$time_iso8601 $host $status $request_time $dstack_by_host_hit';`);
    l.push(...block(`map $upstream_http_${headerVariable(HIT_HEADER)} $dstack_by_host_hit`, ["'' 1;", 'default 0;']), '');
  }
  l.push(...dataplaneUpstream(v));
  if (v.acmePeersTarget !== null) {
    l.push('# ACME challenges missing from the webroot, asked of the API: a few per second per client.');
    l.push(`limit_req_zone $binary_remote_addr zone=${ACME_ASKS_ZONE}:1m rate=${ACME_ASKS_RATE};`, '');
  }
  l.push(...trustedProxies(v));
  l.push(...internalRealIp(v));
  if (v.serverNamesHash) {
    l.push('server_names_hash_bucket_size 128;', 'server_names_hash_max_size 65536;', '');
  }
  if (!v.defaultServer) {
    l.push(...internalDefaultServer(v));
  } else {
    if (v.byHost) {
      l.push('# Hosts without a site: the data plane relays those of a service it routes by host (one whose');
      l.push('# site is not served yet) and sends the rest back to the 404; ACME HTTP-01 challenges as below.');
    } else l.push('# Unknown hosts: 404, except ACME HTTP-01 challenges for domains without a site yet.');
    l.push(
      ...block('server', [
        `listen ${v.listenHttp} default_server;`,
        ...(v.listenInternal && !v.byHost ? [`listen ${v.listenInternal} default_server;`] : []),
        'server_name _;',
        'access_log off;',
        ...acmeLocations(v),
        ...healthLocation(v),
        ...(v.byHost && v.dataplane ? byHostLocations(v.byHost, v.dataplane.name) : block('location /', ['return 404;'])),
      ]),
      '',
    );
    // The model API's internal listener reaches services by their own sites only.
    if (v.byHost) l.push(...internalDefaultServer(v), ...(v.listenInternal ? [''] : []));
    l.push("# Unknown TLS server names: refuse the handshake rather than show another site's certificate.");
    l.push(
      ...block('server', [
        `listen ${v.listenHttps} ssl http2 default_server;`,
        'server_name _;',
        'access_log off;',
        'ssl_reject_handshake on;',
      ]),
    );
  }
  return text(l);
}

/**
 * The default server's relay to the data plane, for hosts without a site: what a service site's
 * replica location sets, the service named by Host (SERVICE_HEADER BY_HOST). A token check and
 * a model's CORS are the data plane's there, no subrequest per request. The data plane's
 * unknown-host answer comes back as an internal redirect to the 404, which logs nothing, as the
 * default server never did.
 */
function byHostLocations(b: NonNullable<GlobalView['byHost']>, upstream: string): Lines {
  return [
    ...block('location /', [
      `access_log ${quote(b.accessLogPath)} ${BY_HOST_LOG_FORMAT};`,
      `client_max_body_size ${b.clientMaxBodySize};`,
      // What the host's site would do beyond this (a token check, a model's CORS) the data plane
      // does, on the same connection: the client's Authorization goes to it as is.
      `proxy_hide_header ${HIT_HEADER};`,
      `proxy_pass http://${upstream};`,
      'proxy_http_version 1.1;',
      ...forwardedHeaders({ behindProxies: b.behindProxies }),
      'proxy_set_header Upgrade $http_upgrade;',
      'proxy_set_header Connection $dstack_connection_upgrade;',
      `proxy_set_header ${SERVICE_HEADER} ${BY_HOST};`,
      `error_page 504 ${TIMEOUT_LOCATION};`,
      `proxy_read_timeout ${b.proxyReadTimeoutSec}s;`,
      `proxy_send_timeout ${b.proxyReadTimeoutSec}s;`,
      'proxy_buffering off;',
    ]),
    ...block(`location ${UNKNOWN_HOST_LOCATION}`, ['access_log off;', 'return 404;']),
    ...timeoutBlock(),
  ];
}

/** Nginx's variable name part for a header: lower case, dashes as underscores. */
function headerVariable(name: string): string {
  return name.toLowerCase().replace(/-/g, '_');
}

/**
 * The data plane's one socket, for every service site (each names its service in a header): one
 * keep-alive pool per worker instead of one per service.
 */
function dataplaneUpstream(v: GlobalView): Lines {
  if (!v.dataplane) return [];
  return [
    '# The data plane: one socket for every service; each site names its service in a header.',
    ...block(`upstream ${v.dataplane.name}`, [
      `server ${quote(v.dataplane.server)};`,
      `keepalive ${DATAPLANE_KEEPALIVE};`,
      // The balancer picks a replica per request, so a pooled connection may live long.
      `keepalive_time ${UPSTREAM_KEEPALIVE_TIME};`,
    ]),
    '',
  ];
}

/**
 * Without our public default server the distribution's default site answers unknown hosts on
 * the public ports (a load balancer's health check), and every domain's ACME challenge is
 * served by its own site (acmeLocation), which is rendered, HTTP only, as soon as the domain is
 * in the document: only a certbot run that reached validation before that reload would miss
 * it, and it is retried on the backoff schedule. An unknown TLS server name gets the first of
 * our HTTPS sites instead of a refused handshake. The internal listener clashes with nobody:
 * its own default server keeps it bound, and 404 for unknown hosts, while no service has a site.
 */
function internalDefaultServer(v: GlobalView): Lines {
  if (!v.listenInternal) return [];
  return [
    "# Unknown hosts on the internal listener: 404 (the public ports' default is the distribution's).",
    ...block('server', [
      `listen ${v.listenInternal} default_server;`,
      'server_name _;',
      'access_log off;',
      ...block('location /', ['return 404;']),
    ]),
  ];
}

/** The `$dstack_forwarded_proto` X-Forwarded-Proto a site passes on (its redirect reads it too). */
export const FORWARDED_PROTO_VARIABLE = '$dstack_forwarded_proto';

/**
 * Behind load balancers (http level, so every site gets it and a site file gets nothing but the
 * variable's name): the client's address is the last one in X-Forwarded-For that is not a trusted
 * proxy's, for $remote_addr, $binary_remote_addr (rate limits), the logs and X-Real-IP; the
 * X-Forwarded-Proto of a trusted peer is kept when it is http or https (Nginx's map ignores case;
 * the value passed on is lower case). Trust is decided on the connection's own peer
 * ($realip_remote_addr): what anyone else sends is replaced. A service's internal-listener
 * server takes the client from X-Real-IP instead (internalRealIp).
 */
function trustedProxies(v: GlobalView): Lines {
  if (v.trustedProxies.length === 0) return [];
  const l: Lines = ["# Load balancers in front: their X-Forwarded-For and X-Forwarded-Proto are believed, nobody else's."];
  l.push(...v.trustedProxies.map((p) => `set_real_ip_from ${p};`), 'real_ip_header X-Forwarded-For;', 'real_ip_recursive on;', '');
  l.push(...block('geo $realip_remote_addr $dstack_trusted_peer', ['default 0;', ...v.trustedProxies.map((p) => `${p} 1;`)]), '');
  l.push(
    ...block(`map "$dstack_trusted_peer:$http_x_forwarded_proto" ${FORWARDED_PROTO_VARIABLE}`, [
      'default $scheme;',
      '"1:http" http;',
      '"1:https" https;',
    ]),
    '',
  );
  return l;
}

/**
 * The internal listener's peer, the only one whose X-Real-IP is believed: a Unix socket only the
 * gateway can connect to. Trusting `unix:` at http level changes nothing for the public servers
 * (their peers are TCP addresses, never `unix:`) and spares every internal-listener server a
 * set_real_ip_from of its own: Nginx builds one address list per server that sets one, which
 * made a reload of 10,000 services a third slower.
 */
function internalRealIp(v: GlobalView): Lines {
  if (!v.listenInternal) return [];
  return ["# The gateway's own model API (internal listener): its X-Real-IP names the client.", 'set_real_ip_from unix:;', ''];
}

/** `GET /` → 200 on the default server, for a load balancer's health check (Host: an address). */
function healthLocation(v: GlobalView): Lines {
  if (!v.healthCheck) return [];
  return block('location = /', [
    ...block('if ($request_method !~ ^(GET|HEAD)$)', ['return 404;']),
    'default_type application/json;',
    `return 200 ${quote('{"status":"ok"}')};`,
  ]);
}

/** A site file: a service's or an entrypoint's server block with what it needs at http level. */
export function renderSite(v: SiteView): string {
  return v.kind === 'service' ? renderServiceSite(v) : renderEntrypointSite(v);
}

function serverHead(v: SiteCommon): Lines {
  const l: Lines = [`server_name ${v.domain};`, `listen ${v.listenHttp};`];
  if (v.tls) {
    l.push(
      `listen ${v.tls.listen} ssl http2;`,
      `ssl_certificate ${quote(v.tls.certPath)};`,
      `ssl_certificate_key ${quote(v.tls.keyPath)};`,
      'ssl_protocols TLSv1.2 TLSv1.3;',
      'ssl_session_cache shared:dstack_ssl:10m;',
      'ssl_session_timeout 1d;',
    );
  }
  l.push('', `access_log ${quote(v.accessLogPath)} ${LOG_FORMAT};`, `client_max_body_size ${v.clientMaxBodySize};`);
  return l;
}

function redirectAndCors(v: SiteCommon): Lines {
  const l: Lines = [];
  if (v.tls) {
    l.push(
      '',
      '# HTTPS only, except ACME challenges.',
      `set $dstack_redirect ${v.behindProxies ? FORWARDED_PROTO_VARIABLE : '$scheme'};`,
      ...block('if ($uri ~ "^/\\.well-known/acme-challenge/")', ['set $dstack_redirect acme;']),
      ...block('if ($dstack_redirect = http)', [`return 301 https://$host${v.tls.redirectPort}$request_uri;`]),
    );
  }
  if (v.cors) {
    l.push(
      '',
      `add_header Access-Control-Allow-Origin ${quote(MODEL_CORS_ORIGIN)} always;`,
      `add_header Access-Control-Allow-Methods ${quote(MODEL_CORS_METHODS)} always;`,
      `add_header Access-Control-Allow-Headers ${quote(MODEL_CORS_HEADERS)} always;`,
      ...block('if ($request_method = OPTIONS)', ['return 204;']),
    );
  }
  return l;
}

function acmeLocation(v: SiteCommon): Lines {
  return ['', ...acmeLocations(v)];
}

/**
 * The HTTP-01 challenge files certbot writes to the webroot. With peers, a file missing here
 * is asked of the API, which asks the other replicas behind the same name (it answers 404 to a
 * peer's own question, so the asking never goes round).
 */
function acmeLocations(v: Pick<SiteCommon, 'acmeWebroot' | 'acmePeersTarget'>): Lines {
  const root = `root ${quote(v.acmeWebroot)};`;
  if (v.acmePeersTarget === null) return block(`location ^~ ${ACME_PREFIX}`, [root]);
  return [
    ...block(`location ^~ ${ACME_PREFIX}`, [root, `try_files $uri ${ACME_PEERS_LOCATION};`]),
    ...block(`location ${ACME_PEERS_LOCATION}`, [
      // Each miss costs the API a database query or a question to every peer: a client sending
      // made-up tokens is held to a few per second. A CA's validations come far below that.
      `limit_req zone=${ACME_ASKS_ZONE} burst=${ACME_ASKS_BURST} nodelay;`,
      'limit_req_status 429;',
      `proxy_pass ${v.acmePeersTarget};`,
      'proxy_set_header Host $host;',
    ]),
  ];
}

/** The zone that limits the challenges asked of the API, per client address. */
const ACME_ASKS_ZONE = 'dstack_acme_asks';
const ACME_ASKS_RATE = '10r/s';
const ACME_ASKS_BURST = 20;

/** The named location a challenge missing from the webroot goes to. */
const ACME_PEERS_LOCATION = '@dstack_acme_peers';

/**
 * Behind trusted proxies X-Forwarded-For is the client alone, as real_ip found it: the entries
 * before it are the client's own say, and a replica reading either end of the list gets the
 * client (appending would put the balancer's address last, where most frameworks look).
 */
function forwardedHeaders(v: Pick<SiteCommon, 'behindProxies'>): Lines {
  if (v.behindProxies) {
    return [
      'proxy_set_header Host $host;',
      'proxy_set_header X-Real-IP $remote_addr;',
      'proxy_set_header X-Forwarded-For $remote_addr;',
      `proxy_set_header X-Forwarded-Proto ${FORWARDED_PROTO_VARIABLE};`,
    ];
  }
  return [
    'proxy_set_header Host $host;',
    'proxy_set_header X-Real-IP $remote_addr;',
    'proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;',
    'proxy_set_header X-Forwarded-Proto $scheme;',
  ];
}

function hideUpstreamCors(v: SiteCommon): Lines {
  if (!v.cors) return [];
  return [
    'proxy_hide_header Access-Control-Allow-Origin;',
    'proxy_hide_header Access-Control-Allow-Methods;',
    'proxy_hide_header Access-Control-Allow-Headers;',
  ];
}

function renderServiceSite(v: ServiceSiteView): string {
  const l: Lines = [MARKER, `# service ${v.serviceKey}`, ''];
  for (const z of v.zones) {
    l.push(`limit_req_zone ${z.key} zone=${z.name}:${LIMIT_REQ_ZONE_SIZE} rate=${z.rate};`);
  }
  if (v.zones.length > 0) l.push('');
  if (v.upstream && 'servers' in v.upstream) {
    l.push(
      ...block(`upstream ${v.upstream.name}`, [
        ...v.upstream.servers.map((s) => `server ${quote(s)};`),
        `keepalive ${UPSTREAM_KEEPALIVE};`,
        // The balancer picks a replica per request, so a pooled connection may live long (Nginx's
        // default); replica changes reach it at the next request, without a reload.
        `keepalive_time ${UPSTREAM_KEEPALIVE_TIME};`,
      ]),
      '',
    );
  }

  const body: Lines = [...serverHead(v), 'limit_req_status 429;', 'limit_req_log_level info;', ...tryFilesRoot(v)];
  body.push(...redirectAndCors(v), ...acmeLocation(v));

  if (v.authUrl) {
    body.push(
      '',
      '# auth_request target: 2xx lets the request through, 401/403 are returned to the client.',
      ...block(`location = ${AUTH_LOCATION}`, authTarget(v, v.authUrl)),
    );
  }

  body.push(
    ...locations(v, { auth: v.authUrl !== null }),
    '',
    ...block(`location ${REPLICA_LOCATION}`, replicaLocation(v, { internal: false })),
    ...timeoutLocation(v),
    ...leftLocation(v),
  );
  l.push(...block('server', body));
  if (v.listenInternal) l.push('', ...internalServer(v, v.listenInternal));
  return text(l);
}

/**
 * Where a site's token check goes. On the shared data-plane socket, answered there (its pool is
 * kept alive, and a gateway taking over from another moves it without a gap); otherwise the
 * API's auth route.
 */
function authTarget(v: ServiceSiteView, authUrl: string): Lines {
  if (!v.upstream || !('shared' in v.upstream)) {
    return [
      'internal;',
      `proxy_pass ${authUrl};`,
      'proxy_pass_request_body off;',
      'proxy_set_header Content-Length "";',
      'proxy_set_header X-Original-URI $request_uri;',
      'proxy_set_header Authorization $http_authorization;',
    ];
  }
  const project = v.serviceKey.slice(0, v.serviceKey.indexOf('/'));
  return [
    'internal;',
    `proxy_pass http://${v.upstream.name};`,
    'proxy_http_version 1.1;',
    'proxy_set_header Connection "";',
    'proxy_pass_request_body off;',
    'proxy_set_header Content-Length "";',
    'proxy_set_header Host $host;',
    'proxy_set_header Authorization $http_authorization;',
    `proxy_set_header ${SERVICE_HEADER} ${quote(`${AUTH_CHECK_PREFIX}${project}`)};`,
  ];
}

/**
 * try_files looks for /nonexistent under the root before it enters the replica location; the
 * default root (<prefix>/html of a private Nginx) is inside the state dir, which the workers
 * cannot enter: every request would log a [crit] EACCES. The ACME webroot is theirs to read.
 */
function tryFilesRoot(v: SiteCommon): Lines {
  return [`root ${quote(v.acmeWebroot)};`];
}

/** The prefix locations: auth (public server only), then the limits, then the replica. */
function locations(v: ServiceSiteView, o: { auth: boolean }): Lines {
  const out: Lines = [];
  for (const loc of v.locations) {
    const lb: Lines = [];
    if (o.auth) lb.push(`auth_request ${AUTH_LOCATION};`);
    for (const lim of loc.limits) {
      lb.push(lim.burst > 0 ? `limit_req zone=${lim.zone} burst=${lim.burst} nodelay;` : `limit_req zone=${lim.zone};`);
    }
    lb.push(`try_files /nonexistent ${REPLICA_LOCATION};`);
    out.push('', ...block(`location ${loc.exact ? '= ' : ''}${quote(loc.prefix)}`, lb));
  }
  if (v.refuseOtherPaths) {
    // `return` runs in the rewrite phase: a refused path is answered before auth and limits,
    // and never counts as a replica hit.
    out.push(
      '',
      '# router allowlist: every other path is refused',
      ...block('location /', ['default_type application/json;', `return 403 ${quote(ROUTER_REFUSED_BODY)};`]),
    );
  }
  return out;
}

/**
 * Once the service has left the document, the data plane answers what this site still sends it
 * (until the reload that drops the site) as the default server answers an unknown host: this
 * internal redirect to Nginx's own 404, which counts nothing in the access log.
 */
function leftLocation(v: ServiceSiteView): Lines {
  if (!v.upstream || !('shared' in v.upstream)) return [];
  return ['', ...block(`location ${UNKNOWN_HOST_LOCATION}`, ['access_log off;', 'return 404;'])];
}

/**
 * A replica silent past the read timeout gets Nginx's own 504, an HTML page no API client can
 * read: answered instead in JSON with the data plane's words for it, as every other error of a
 * service is. Only Nginx's own 504: without proxy_intercept_errors a replica's 504 passes as it is.
 */
const TIMEOUT_BODY = JSON.stringify({ detail: 'Timed out requesting upstream' });

function timeoutLocation(v: ServiceSiteView): Lines {
  if (!v.upstream) return [];
  return ['', ...timeoutBlock()];
}

function timeoutBlock(): Lines {
  return block(`location ${TIMEOUT_LOCATION}`, ['default_type application/json;', `return 504 ${quote(TIMEOUT_BODY)};`]);
}

/** What a path outside the router allowlist gets: dstack's in-server proxy's words. */
const ROUTER_REFUSED_BODY = JSON.stringify({ detail: 'Path is not allowed for this service' });

function replicaLocation(v: ServiceSiteView, o: { internal: boolean }): Lines {
  const rb: Lines = ['set $dstack_replica_hit 1;'];
  if (!v.upstream) {
    const body503 = JSON.stringify({ detail: `Service ${v.serviceKey} has no ready replica` });
    rb.push('default_type application/json;', `return 503 ${quote(body503)};`);
    return rb;
  }
  rb.push(`proxy_pass http://${v.upstream.name};`, 'proxy_http_version 1.1;', `error_page 504 ${TIMEOUT_LOCATION};`);
  if (o.internal) {
    // The model API sends the client's forwarding chain (ending with the client) as is.
    rb.push(
      'proxy_set_header Host $host;',
      'proxy_set_header X-Real-IP $remote_addr;',
      'proxy_set_header X-Forwarded-For $http_x_forwarded_for;',
      'proxy_set_header X-Forwarded-Proto $http_x_forwarded_proto;',
    );
  } else {
    rb.push(...forwardedHeaders(v));
  }
  rb.push('proxy_set_header Upgrade $http_upgrade;', 'proxy_set_header Connection $dstack_connection_upgrade;');
  // The shared socket's service: set here, it replaces any header of that name a client sent.
  if ('shared' in v.upstream) rb.push(`proxy_set_header ${SERVICE_HEADER} ${quote(v.serviceKey)};`);
  // The gateway's token is not the replica's business; the model API never passes one on.
  if (v.authUrl || o.internal) rb.push('proxy_set_header Authorization "";');
  rb.push(`proxy_read_timeout ${v.readTimeoutSec}s;`, `proxy_send_timeout ${v.proxyReadTimeoutSec}s;`, 'proxy_buffering off;');
  if (!o.internal) rb.push(...hideUpstreamCors(v));
  return rb;
}

/**
 * The service on the internal listener, for the gateway's model API: the same limits and
 * replica, no auth_request (the model API checked the token), no redirect or CORS. The client's
 * address comes from X-Real-IP — the global file's set_real_ip_from unix: trusts it only on this
 * socket, which only the gateway can connect to — so limits keyed by address count per client.
 */
function internalServer(v: ServiceSiteView, listen: string): Lines {
  const body: Lines = [
    `server_name ${v.domain};`,
    `listen ${listen};`,
    '',
    `access_log ${quote(v.accessLogPath)} ${LOG_FORMAT};`,
    `client_max_body_size ${v.clientMaxBodySize};`,
    'limit_req_status 429;',
    'limit_req_log_level info;',
    ...tryFilesRoot(v),
    'real_ip_header X-Real-IP;',
    ...locations(v, { auth: false }),
    '',
    ...block(`location ${REPLICA_LOCATION}`, replicaLocation(v, { internal: true })),
    ...timeoutLocation(v),
    ...leftLocation(v),
  ];
  return ["# the same service for the gateway's own model API (internal listener)", ...block('server', body)];
}

function renderEntrypointSite(v: EntrypointSiteView): string {
  const l: Lines = [MARKER, `# entrypoint of project ${v.project}: the OpenAI-compatible model API`, ''];
  const body: Lines = [...serverHead(v), ...redirectAndCors(v), ...acmeLocation(v)];
  body.push(
    '',
    ...block('location /', [
      `proxy_pass ${v.target};`,
      'proxy_http_version 1.1;',
      ...forwardedHeaders(v),
      ...(v.viaDataplane ? [`proxy_set_header ${SERVICE_HEADER} ${MODEL_API};`] : []),
      // The key that tells the model API this request came through its own Nginx, which set X-Real-IP.
      ...(v.keyInclude ? [`include ${quote(v.keyInclude)};`] : []),
      'proxy_set_header Connection "";',
      `proxy_read_timeout ${v.proxyReadTimeoutSec}s;`,
      `proxy_send_timeout ${v.proxyReadTimeoutSec}s;`,
      'proxy_buffering off;',
      ...hideUpstreamCors(v),
    ]),
  );
  l.push(...block('server', body));
  return text(l);
}

/** Every file of a view set, keyed by file name relative to the managed conf dir. */
export function renderAll(views: { global: GlobalView; sites: SiteView[] }): Map<string, string> {
  const out = new Map<string, string>([[views.global.fileName, renderGlobal(views.global)]]);
  for (const s of views.sites) out.set(s.fileName, renderSite(s));
  return out;
}
