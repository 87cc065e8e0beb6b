// The typed view model the Nginx templates render (a typed view model → one template →
// text). buildViews is pure: everything it needs from the world (certificates, upstream
// addresses) comes in through options.

import { ProxyError } from '../../errors.js';
import type { Entrypoint, ProxyState, RateLimit, Service } from '../../spec/types.js';
import { DEFAULT_CLIENT_MAX_BODY_SIZE, ROUTER_ALLOWED_PATHS, serviceKey } from '../../spec/types.js';
import { servesCors } from '../../spec/cors.js';
import { checkTrustedProxy } from './trusted-proxies.js';
import { fileNameFor, limitKeyVariable, listenAddress, rateFor, serverAddress, upstreamName, zoneName } from './names.js';

export interface CertPaths {
  certPath: string;
  keyPath: string;
}

/** Where Nginx sends a service's traffic. */
export type UpstreamTarget =
  | { kind: 'direct'; servers: string[] } // "host:port" each
  | { kind: 'socket'; path: string } // one Unix socket per service (the SSH loop's balancer)
  | { kind: 'shared' }; // the data plane's one socket (ViewOptions.dataplaneSocket), the service named by a header

/** The global file's upstream of the shared data-plane socket. */
export const DATAPLANE_UPSTREAM = 'dstack_dataplane';

export interface ViewOptions {
  httpPort: number;
  httpsPort: number;
  /** '' listens on every address. Default '127.0.0.1'. */
  listenHost?: string;
  /** auth_request and model API target. Default 'http://127.0.0.1:8000'. */
  apiUrl?: string;
  /** Default 300 s. */
  proxyReadTimeoutSec?: number;
  acmeWebroot: string;
  accessLogPath: string;
  /** null: the certificate is not Ready, render HTTP only. Default: always null. */
  certFor?: (domain: string) => CertPaths | null;
  /** Default: the service's `direct` replicas; SSH replicas are skipped. */
  upstreamFor?: (service: Service) => UpstreamTarget;
  /**
   * The data plane's shared socket: the global file declares one upstream of it, which every
   * service whose upstreamFor says `shared` proxies to. Default none.
   */
  dataplaneSocket?: string | null;
  /**
   * Render a default server (404 on HTTP, handshake rejected on HTTPS). false leaves the public
   * ports' default to another site (the distribution's); the internal listener keeps its own.
   * Default true.
   */
  defaultServer?: boolean;
  /** Put server_names_hash_* in the global file (when the main conf doesn't). Default false. */
  serverNamesHash?: boolean;
  /**
   * The gateway's internal listener: a Unix socket in a directory only the gateway can enter.
   * Each service site gets a second server on it for the model API's requests: no auth_request,
   * no redirect, the client address taken from X-Real-IP. Default none.
   */
  internalSocket?: string | null;
  /**
   * A file of `proxy_set_header` lines the entrypoint sites include: the key that tells the model
   * API a request came through an entrypoint site (so its X-Real-IP is Nginx's, not a client's).
   * Kept out of the site files so that plans and diffs never show it. Default none.
   */
  entrypointKeyInclude?: string | null;
  /**
   * Load balancers in front of the gateway (addresses or networks, checked by
   * parseTrustedProxies): the client's address and X-Forwarded-Proto are taken from their
   * X-Forwarded-* headers, nobody else's. Default none.
   */
  trustedProxies?: readonly string[];
  /** The default server answers 200 on `GET /` (load-balancer health checks). Default false. */
  healthCheck?: boolean;
  /**
   * An ACME challenge file missing from the webroot is asked of the API (apiUrl), which asks
   * this gateway's peers: a replica behind a shared name answers a challenge another one
   * requested. Default false.
   */
  acmePeers?: boolean;
  /**
   * The public default server sends every request (but ACME challenges and the health check) to
   * the data plane's shared socket, naming no service: the data plane relays those of a host it
   * has a by-host route for, so a new service is served before the reload that brings its own
   * site in, and answers the rest with this server's 404. Needs dataplaneSocket and
   * defaultServer. Default false.
   */
  byHostDefault?: boolean;
}

export interface TlsView {
  listen: string;
  certPath: string;
  keyPath: string;
  /** ":8443" when the HTTPS port is not 443, else "". Used in the redirect. */
  redirectPort: string;
}

export interface SiteCommon {
  domain: string;
  fileName: string;
  project: string;
  listenHttp: string;
  /** `unix:<path>` of the internal listener, or null. */
  listenInternal: string | null;
  tls: TlsView | null;
  accessLogPath: string;
  acmeWebroot: string;
  /** Where a challenge missing from the webroot is asked for (the API: it asks the peers), or null. */
  acmePeersTarget: string | null;
  clientMaxBodySize: number;
  proxyReadTimeoutSec: number;
  /** CORS headers and OPTIONS → 204 (OpenAI-compatible APIs called from browsers). */
  cors: boolean;
  /** Trusted proxies are configured: forwarded headers use the global file's variables. */
  behindProxies: boolean;
}

export interface ZoneView {
  name: string;
  key: string; // an Nginx variable, e.g. $binary_remote_addr
  rate: string; // e.g. 2r/s, 30r/m
}

export interface LocationView {
  prefix: string;
  /** `location = <prefix>`: that path only. */
  exact?: boolean;
  limits: { zone: string; burst: number }[];
}

export interface ServiceSiteView extends SiteCommon {
  kind: 'service';
  serviceKey: string;
  /**
   * The site's own upstream (`servers`), or the global file's shared one, which needs the
   * service named in SERVICE_HEADER (the data plane answers for a service without a replica).
   * null: no replica to send to, the site answers 503.
   */
  upstream: { name: string; servers: string[] } | { name: string; shared: true } | null;
  zones: ZoneView[];
  /** Sorted by prefix; contains "/" unless `refuseOtherPaths`. */
  locations: LocationView[];
  /** Only `locations` reach the replica; `location /` answers 403 (the router allowlist). */
  refuseOtherPaths: boolean;
  /** proxy_read_timeout of this service: its own readTimeout, else the daemon's. */
  readTimeoutSec: number;
  /** auth_request target, or null when the service is public. */
  authUrl: string | null;
}

export interface EntrypointSiteView extends SiteCommon {
  kind: 'entrypoint';
  /** proxy_pass target: the model API of the project. */
  target: string;
  /** The target is the shared data-plane socket, which gives the connection to the model API. */
  viaDataplane: boolean;
  /** Included in the proxying location (ViewOptions.entrypointKeyInclude), or null. */
  keyInclude: string | null;
}

export type SiteView = ServiceSiteView | EntrypointSiteView;

export interface GlobalView {
  kind: 'global';
  fileName: string;
  listenHttp: string;
  listenInternal: string | null;
  listenHttps: string;
  acmeWebroot: string;
  acmePeersTarget: string | null;
  defaultServer: boolean;
  serverNamesHash: boolean;
  /** ViewOptions.trustedProxies, checked; empty = off. */
  trustedProxies: string[];
  healthCheck: boolean;
  /** The shared data-plane upstream (ViewOptions.dataplaneSocket), or null. */
  dataplane: { name: string; server: string } | null;
  /** ViewOptions.byHostDefault: what the default server's relay to the data plane sets. */
  byHost: {
    accessLogPath: string;
    clientMaxBodySize: number;
    proxyReadTimeoutSec: number;
    behindProxies: boolean;
  } | null;
}

export interface Views {
  global: GlobalView;
  sites: SiteView[];
}

export const DEFAULT_API_URL = 'http://127.0.0.1:8000';
export const DEFAULT_PROXY_READ_TIMEOUT_SEC = 300;

/** The default upstream, without an SSH loop to reach the other replicas: `direct` replicas as host:port. */
export function directUpstream(service: Service): UpstreamTarget {
  const servers: string[] = [];
  for (const r of service.replicas) {
    if (r.direct) servers.push(serverAddress(r.direct.host, r.direct.port));
  }
  return { kind: 'direct', servers };
}

/** `listen` argument of the internal listener; the path must fit a sockaddr_un (107 bytes). */
export function internalListen(path: string): string {
  return unixAddress(path, 'the internal socket path', '; use a shorter --state-dir');
}

/** `unix:<path>` of a socket Nginx listens on or connects to; refused unless absolute and short enough for sun_path. */
function unixAddress(path: string, what: string, hint = ''): string {
  if (!path.startsWith('/')) throw new ProxyError('DP_ERR_BAD_OPTION', `${what} must be absolute, got ${path}`);
  if (Buffer.byteLength(path) > 107)
    throw new ProxyError('DP_ERR_BAD_OPTION', `${what} is longer than 107 bytes (a Unix socket limit): ${path}${hint}`);
  // Written into the config unquoted, and a ':' would end the path in a `http://unix:…:/uri` target.
  if (/[\s;{}'"\\$#:\u0000-\u001f\u007f]/.test(path))
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `${what} holds a character Nginx's config cannot take unquoted (space, ; { } ' " \\ $ # :): ${path}`,
    );
  return `unix:${path}`;
}

function checkOptions(opts: ViewOptions): void {
  for (const [name, port] of [
    ['httpPort', opts.httpPort],
    ['httpsPort', opts.httpsPort],
  ] as const) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new ProxyError('DP_ERR_BAD_OPTION', `${name} must be a port number, got ${String(port)}`);
    }
  }
  const apiUrl = opts.apiUrl ?? DEFAULT_API_URL;
  if (!/^https?:\/\/[A-Za-z0-9.\-[\]:]+$/.test(apiUrl)) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `apiUrl must be scheme://host[:port] without a path, got ${apiUrl}`);
  }
  const t = opts.proxyReadTimeoutSec ?? DEFAULT_PROXY_READ_TIMEOUT_SEC;
  if (!Number.isInteger(t) || t < 1) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `proxyReadTimeoutSec must be a positive integer, got ${t}`);
  }
  // Checked again here (the option was at start) because these go into the config verbatim.
  for (const p of opts.trustedProxies ?? []) checkTrustedProxy(p, 'trustedProxies');
}

/** Build the global view and one site view per service domain and per entrypoint. */
export function buildViews(state: ProxyState, opts: ViewOptions): Views {
  checkOptions(opts);
  const listenHost = opts.listenHost ?? '127.0.0.1';
  const apiUrl = opts.apiUrl ?? DEFAULT_API_URL;
  const certFor = opts.certFor ?? (() => null);
  const upstreamFor = opts.upstreamFor ?? directUpstream;
  const listenHttp = listenAddress(listenHost, opts.httpPort);
  const listenHttps = listenAddress(listenHost, opts.httpsPort);
  const listenInternal = opts.internalSocket ? internalListen(opts.internalSocket) : null;
  const dataplane = opts.dataplaneSocket
    ? { name: DATAPLANE_UPSTREAM, server: unixAddress(opts.dataplaneSocket, 'the data-plane socket path') }
    : null;
  const redirectPort = opts.httpsPort === 443 ? '' : `:${opts.httpsPort}`;
  const acmePeersTarget = opts.acmePeers ? apiUrl : null;
  const trustedProxies = [...new Set(opts.trustedProxies ?? [])];
  const behindProxies = trustedProxies.length > 0;

  const common = (domain: string, project: string, https: boolean): SiteCommon => {
    const cert = https ? certFor(domain) : null;
    return {
      domain,
      fileName: fileNameFor({ kind: 'site', domain }),
      project,
      listenHttp,
      listenInternal,
      tls: cert ? { listen: listenHttps, certPath: cert.certPath, keyPath: cert.keyPath, redirectPort } : null,
      accessLogPath: opts.accessLogPath,
      acmeWebroot: opts.acmeWebroot,
      acmePeersTarget,
      clientMaxBodySize: 0,
      proxyReadTimeoutSec: opts.proxyReadTimeoutSec ?? DEFAULT_PROXY_READ_TIMEOUT_SEC,
      cors: false,
      behindProxies,
    };
  };

  const sites: SiteView[] = [];
  for (const s of state.spec.services) {
    if (!s.domain) continue; // in-server only
    const target = upstreamFor(s);
    if (target.kind === 'shared' && dataplane === null)
      throw new ProxyError('DP_ERR_BAD_OPTION', `${serviceKey(s)} is sent to the shared data-plane socket, but no dataplaneSocket is set`);
    sites.push(serviceSite(s, common(s.domain, s.project, s.https), target, apiUrl));
  }
  const keyInclude = opts.entrypointKeyInclude ?? null;
  // Through the data plane's socket when there is one: a take-over moves it without a gap, where
  // the API's TCP port changes hands.
  const modelApiUrl = dataplane ? `http://${dataplane.server}:` : apiUrl;
  for (const e of state.spec.entrypoints)
    sites.push(entrypointSite(e, common(e.domain, e.project, e.https), modelApiUrl, dataplane !== null, keyInclude));

  const seen = new Set<string>();
  for (const site of sites) {
    if (seen.has(site.domain)) throw new ProxyError('DP_ERR_INTERNAL', `duplicate domain ${site.domain}`);
    seen.add(site.domain);
  }
  sites.sort((a, b) => (a.domain < b.domain ? -1 : a.domain > b.domain ? 1 : 0));

  return {
    global: {
      kind: 'global',
      fileName: fileNameFor({ kind: 'global' }),
      listenHttp,
      listenInternal,
      listenHttps,
      acmeWebroot: opts.acmeWebroot,
      acmePeersTarget,
      defaultServer: opts.defaultServer ?? true,
      serverNamesHash: opts.serverNamesHash ?? false,
      trustedProxies,
      healthCheck: opts.healthCheck ?? false,
      dataplane,
      byHost:
        opts.byHostDefault && dataplane && (opts.defaultServer ?? true)
          ? {
              accessLogPath: opts.accessLogPath,
              clientMaxBodySize: DEFAULT_CLIENT_MAX_BODY_SIZE,
              proxyReadTimeoutSec: opts.proxyReadTimeoutSec ?? DEFAULT_PROXY_READ_TIMEOUT_SEC,
              behindProxies,
            }
          : null,
    },
    sites,
  };
}

function serviceSite(s: Service, common: SiteCommon, target: UpstreamTarget, apiUrl: string): ServiceSiteView {
  const key = serviceKey(s);
  const servers = target.kind === 'socket' ? [`unix:${target.path}`] : target.kind === 'direct' ? target.servers : [];
  const zones: ZoneView[] = [];
  const allowlist = s.routerAllowlist === true;
  const byPrefix = new Map<string, LocationView>(allowlist ? [] : [['/', { prefix: '/', limits: [] }]]);
  s.rateLimits.forEach((rl: RateLimit, i: number) => {
    const keyVar = limitKeyVariable(rl.key);
    const name = zoneName(key, i, keyVar);
    zones.push({ name, key: keyVar, rate: rateFor(rl.rps) });
    let loc = byPrefix.get(rl.prefix);
    if (!loc) {
      loc = { prefix: rl.prefix, limits: [] };
      byPrefix.set(rl.prefix, loc);
    }
    loc.limits.push({ zone: name, burst: rl.burst });
  });
  const locations = (allowlist ? allowedLocations(byPrefix) : [...byPrefix.values()]).sort((a, b) =>
    a.prefix < b.prefix ? -1 : a.prefix > b.prefix ? 1 : 0,
  );
  return {
    ...common,
    kind: 'service',
    serviceKey: key,
    clientMaxBodySize: s.clientMaxBodySize,
    cors: servesCors(s),
    upstream:
      target.kind === 'shared'
        ? { name: DATAPLANE_UPSTREAM, shared: true }
        : servers.length > 0
          ? { name: upstreamName(key), servers }
          : null,
    zones,
    locations,
    refuseOtherPaths: allowlist,
    readTimeoutSec: s.readTimeout ?? common.proxyReadTimeoutSec,
    authUrl: s.auth ? `${apiUrl}/api/auth/${s.project}` : null,
  };
}

/**
 * The locations of a router service: one per allowed path, each with the limits of the longest
 * rate-limit prefix it starts with (a limit on `/` or `/v1` covers `/v1/`), as dstack folds them.
 * A limit deeper inside an allowed prefix (`/v1/chat/`) keeps a location of its own, as it would
 * without the allowlist; a limit on a refused path has nothing to limit.
 */
function allowedLocations(limitsByPrefix: ReadonlyMap<string, LocationView>): LocationView[] {
  const out: LocationView[] = [];
  for (const a of ROUTER_ALLOWED_PATHS) {
    const path = a.exact ?? a.prefix!;
    let best: LocationView | undefined;
    for (const loc of limitsByPrefix.values()) {
      if (path.startsWith(loc.prefix) && (best === undefined || loc.prefix.length > best.prefix.length)) best = loc;
      else if (a.prefix !== undefined && loc.prefix.length > path.length && loc.prefix.startsWith(path)) out.push(loc);
    }
    const limits = best?.limits ?? [];
    out.push(a.exact !== undefined ? { prefix: path, exact: true, limits } : { prefix: path, limits });
  }
  return out;
}

function entrypointSite(
  e: Entrypoint,
  common: SiteCommon,
  apiUrl: string,
  viaDataplane: boolean,
  keyInclude: string | null,
): EntrypointSiteView {
  return {
    ...common,
    kind: 'entrypoint',
    viaDataplane,
    keyInclude,
    clientMaxBodySize: 64 * 1024 * 1024, // 64 MiB, the service default
    cors: true,
    target: `${apiUrl}/api/models/${e.project}/`,
  };
}
