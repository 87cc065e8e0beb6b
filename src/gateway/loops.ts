// The gateway's three loops, configured from its options: SSH (tunnels and the data plane's one
// socket for every service), TLS (certbot) and Nginx (sites pointing at that socket and the
// certificates).

import { parseAcmePeers } from './acme-peers.js';
import { tokenDecision } from '../api/auth-routes.js';
import { noServerAuth, type AuthProvider } from '../auth/index.js';
import { resolve } from 'node:path';
import { createNginxLoop, DEFAULT_MIN_RELOAD_INTERVAL_MS, NGINX_LOOP, type NginxLoopOptions } from '../reconcilers/nginx/loop.js';
import { parseTrustedProxies } from '../reconcilers/nginx/trusted-proxies.js';
import { createSshLoop, SSH_LOOP, type SshLoop, type SshLoopOptions } from '../reconcilers/ssh/index.js';
import { createTlsLoop, TLS_LOOP, type TlsLoop } from '../reconcilers/tls/index.js';
import type { SharedCertificates } from '../reconcilers/tls/shared.js';
import type { GatewayHost } from './nginx-host.js';
import type { GatewayOptions } from './options.js';

export interface GatewayLoopDeps {
  /** SSH loop overrides (tests: short keepalive, reconnect). */
  ssh?: Partial<SshLoopOptions>;
  /** DNS pre-flight resolver of the TLS loop (tests resolve everything to 127.0.0.1). */
  resolve?: (domain: string) => Promise<unknown>;
  /** Test hook passed to the Nginx loop. */
  renderHook?: NginxLoopOptions['renderHook'];
  /** Nginx loop overrides (the bench compares reload intervals). */
  nginxLoop?: Pick<NginxLoopOptions, 'minReloadIntervalMs'>;
}

export interface GatewayLoops {
  ssh: SshLoop;
  tls: TlsLoop;
  nginx: ReturnType<typeof createNginxLoop>;
  /** What the sites are rendered with, read at every pass (apiUrl is fixed up once the API listens). */
  view: NginxLoopOptions['view'];
}

export function gatewayLoops(
  options: GatewayOptions,
  host: GatewayHost,
  currentGeneration: () => number,
  deps: GatewayLoopDeps,
  auth: AuthProvider = noServerAuth,
  shared?: SharedCertificates,
): GatewayLoops {
  const { stateDir, workerDirs } = host;
  const view: NginxLoopOptions['view'] = {
    httpPort: options.httpPort,
    httpsPort: options.httpsPort,
    listenHost: options.listenHost,
    apiUrl: apiTarget(options.apiHost, options.apiPort),
    proxyReadTimeoutSec: Math.round(options.proxyReadTimeout),
    acmeWebroot: workerDirs.acmeWebroot,
    accessLogPath: host.accessLog,
    internalSocket: host.internal.socketPath,
    entrypointKeyInclude: host.internal.keyInclude,
    trustedProxies: parseTrustedProxies(options.trustedProxies),
    healthCheck: options.healthCheckOk === 'true',
    // A challenge missing from the webroot is asked of the peers, or of the fleet's database.
    acmePeers: parseAcmePeers(options.acmeChallengePeers).length > 0 || shared !== undefined,
    defaultServer: options.defaultServer === 'true',
    // A new service without auth, limits or a certificate is served through our default server
    // as soon as the data plane has it, before the reload that brings its own site in.
    byHostDefault: true,
  };
  const ssh = createSshLoop({
    stateDir,
    socketDir: workerDirs.socketDir,
    ...(workerDirs.gid !== null ? { socketGid: workerDirs.gid, socketMode: 0o660 } : {}),
    keepaliveIntervalMs: options.sshKeepaliveInterval * 1000,
    keepaliveCountMax: options.sshKeepaliveCountMax,
    shareConnections: options.sshShareConnections === 'true',
    drainMs: options.drainPeriod * 1000,
    // A private Nginx stops with this process: nothing could take over from it.
    successorWaitMs: options.nginx === 'system' ? options.successorWait * 1000 : 0,
    // One socket, one upstream and keep-alive pool in Nginx, whatever the number of services.
    sharedSocket: true,
    // What the default server relays by Host (view.byHostDefault), and its token check.
    hostRoutes: true,
    hostAuth: (project, authorization) => tokenDecision(auth, project, authorization),
    // A removed service's replicas stay until Nginx has stopped routing to it.
    routedBy: NGINX_LOOP,
    ...(deps.ssh ?? {}),
  });
  // The socket the global file's one data-plane upstream points at.
  view.dataplaneSocket = ssh.balancer.sharedSocketPath;
  const tls = createTlsLoop({
    stateDir,
    acmeWebroot: workerDirs.acmeWebroot,
    certbotBin: options.certbotBin,
    timeoutMs: options.certbotTimeout * 1000,
    dnsPreflight: options.dnsPreflight === 'true',
    certbotDirs: host.certbotDirs,
    ...(options.acmeCaBundle ? { env: { REQUESTS_CA_BUNDLE: resolve(options.acmeCaBundle) } } : {}),
    ...(deps.resolve ? { resolve: deps.resolve } : {}),
    ...(shared ? { shared } : {}),
  });
  const nginx = createNginxLoop({
    confDir: host.confDir,
    verifyEveryMs: options.resyncInterval * 1000,
    mainConfPath: host.mainConfPath,
    test: host.test,
    reload: host.reload,
    view,
    // A domain's certificate, from the TLS loop's status; every service's upstream, the data
    // plane's shared socket (so replica changes need no reload), the site naming its service.
    upstreamFor: () => ({ kind: 'shared' }),
    dependsOn: [TLS_LOOP, SSH_LOOP],
    // Certificates come from the TLS loop's status; the SSH loop only has to have bound the
    // sockets first (its tunnels' ups and downs, a retired socket closing, change no site).
    triggeredBy: [TLS_LOOP],
    ...(deps.renderHook ? { renderHook: deps.renderHook } : {}),
    // The private master lives and dies with the loop that reloads it.
    ...(host.nginx ? { master: host.nginx } : {}),
    currentGeneration,
    minReloadIntervalMs: DEFAULT_MIN_RELOAD_INTERVAL_MS,
    ...(deps.nginxLoop ?? {}),
  });
  return { ssh, tls, nginx, view };
}

/** Where the sites reach the API (auth_request, the model API): a wildcard means loopback. */
export function apiTarget(apiHost: string, port: number): string {
  const host = apiHost === '0.0.0.0' || apiHost === '::' ? '127.0.0.1' : apiHost;
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
}
