// Gateway options: defaults < --config FILE (YAML) < env DSTACK_PROXY_* < flags, through the
// daemons' one option table (option-table.ts). Every option is checked at the door; a bad one
// stops the start with a sentence naming it.
// docs/configuration.md documents each with its default (test/gateway/options.test.ts checks).

import { parseAcmePeers } from './acme-peers.js';
import { isAbsolute } from 'node:path';
import { ProxyError } from '../errors.js';
import { quote } from '../reconcilers/nginx/names.js';
import { parseTrustedProxies } from '../reconcilers/nginx/trusted-proxies.js';
import { resolveTable, type OptionSources, type OptionSpec } from '../option-table.js';

export { envName, kebab } from '../option-table.js';

export interface GatewayOptions {
  stateDir: string;
  db: string | undefined;
  acmeChallengePeers: string | undefined;
  apiHost: string;
  apiPort: number;
  nginx: 'private' | 'system';
  listenHost: string;
  httpPort: number;
  httpsPort: number;
  sitesDir: string | undefined;
  reloadCommand: string;
  testCommand: string;
  nginxConf: string;
  nginxBin: string;
  nginxUser: string;
  nginxWorkerDir: string | undefined;
  resyncInterval: number;
  proxyReadTimeout: number;
  trustedProxies: string;
  healthCheckOk: 'true' | 'false';
  defaultServer: 'true' | 'false';
  accessLog: string | undefined;
  apiTokenFile: string | undefined;
  insecureOpenApi: 'true' | 'false';
  sshKeepaliveInterval: number;
  sshKeepaliveCountMax: number;
  sshShareConnections: 'true' | 'false';
  drainPeriod: number;
  takeOver: 'true' | 'false';
  successorWait: number;
  serverUrl: string | undefined;
  authCacheTtl: number;
  authTimeout: number;
  certbotBin: string;
  certbotTimeout: number;
  certbotDir: string | undefined;
  certbotConfigDir: string | undefined;
  acmeCaBundle: string | undefined;
  dnsPreflight: 'true' | 'false';
  dstackCompat: 'true' | 'false';
  dstackCompatReplicaWait: number;
  dstackCompatTls: 'wait' | 'async';
  logLevel: 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';
}

export const OPTION_SPECS = {
  stateDir: {
    kind: 'string',
    default: '.dstack-proxy',
    help: 'state.json, the private Nginx prefix, sockets and certificates live here (created 0700)',
  },
  db: {
    kind: 'string',
    default: undefined,
    help: 'where the document is kept instead of <state-dir>/state.json: postgres://… (several gateways share one document: a change through any of them, or written into the database, reaches all of them through LISTEN/NOTIFY) or sqlite:PATH (one host). The password is never printed. Everything else stays in --state-dir, per gateway',
  },
  apiHost: {
    kind: 'string',
    default: '127.0.0.1',
    help: 'address of the API; a non-loopback one needs --api-token-file (or --insecure-open-api true). Without a token keep it on loopback: a control server elsewhere comes in through an SSH tunnel',
  },
  apiPort: {
    kind: 'port',
    default: 8000,
    help: 'port of the management API and of the model API (/api/models/<project>); the sites reach the model API and token checks through the data-plane socket',
  },
  nginx: {
    kind: 'enum',
    values: ['private', 'system'],
    default: 'private',
    help: '`private`: run and supervise our own nginx under the state dir; `system`: write into --sites-dir and run --reload-command',
  },
  listenHost: { kind: 'string', default: '', help: 'address the Nginx sites listen on; empty = all addresses' },
  httpPort: { kind: 'port', default: 80, help: 'HTTP port of the sites and of the ACME challenge' },
  httpsPort: { kind: 'port', default: 443, help: 'HTTPS port of the sites' },
  sitesDir: {
    kind: 'string',
    default: undefined,
    help: 'system mode: the directory the system nginx.conf includes (`include <dir>/*.conf;` in its http block); private mode: <state-dir>/nginx/sites',
  },
  reloadCommand: { kind: 'string', default: 'nginx -s reload', help: 'system mode: how to reload Nginx (argv split on spaces, no shell)' },
  testCommand: {
    kind: 'string',
    default: 'nginx -t -q',
    help: 'system mode: how to test a candidate configuration (`-c <candidate main conf>` is appended)',
  },
  nginxConf: {
    kind: 'string',
    default: '/etc/nginx/nginx.conf',
    help: 'system mode: the main conf; it must include `<sites-dir>/*.conf` and `<sites-dir>/sites/*.conf` by literal path',
  },
  nginxBin: { kind: 'string', default: '/usr/sbin/nginx', help: 'the nginx binary (private mode)' },
  nginxUser: {
    kind: 'string',
    default: 'www-data',
    help: "the unprivileged user Nginx's workers run as (private mode, when the gateway runs as root; with the system Nginx, the user its workers already run as); only it gets the balancer sockets, the ACME webroot and the temp dirs; root is refused",
  },
  nginxWorkerDir: {
    kind: 'string',
    default: undefined,
    help: "the dir of what Nginx's workers open by path (balancer sockets, ACME webroot, temp files), owned by --nginx-user's group, mode 0710; its parents must let that user in; default <state-dir>-nginx (the state dir stays 0700)",
  },
  resyncInterval: { kind: 'seconds', default: 60, help: 'seconds between periodic passes that repair drift' },
  proxyReadTimeout: {
    kind: 'seconds',
    default: 300,
    help: "seconds Nginx waits between two reads from a replica; a service's readTimeout overrides it",
  },
  trustedProxies: {
    kind: 'string',
    default: '',
    help: "comma-separated addresses or networks (`10.0.0.0/16,2001:db8::/32`) of load balancers in front of the gateway: the client's address (rate limits, logs, X-Real-IP and X-Forwarded-For to replicas) is taken from their X-Forwarded-For, and their X-Forwarded-Proto (http or https) is passed on; from anyone else both are replaced. Empty = trust nobody",
  },
  healthCheckOk: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'false',
    help: '`true`: the default server (unknown hosts, e.g. a load balancer\'s health check with the instance address as Host) answers `GET /` with 200 `{"status":"ok"}`; other paths stay 404',
  },
  defaultServer: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'true',
    help: "`true`: our catch-all answers unknown hosts (404 on HTTP, the TLS handshake refused on HTTPS); `false`: no `default_server` of ours, so the distribution's default site (Ubuntu's `listen 80 default_server`) keeps answering them; --health-check-ok true needs `true`",
  },
  accessLog: {
    kind: 'string',
    default: undefined,
    help: 'the access log the sites write and the stats collector follows (across rotation: rename, then USR1 to the Nginx master); an absolute path; default <state-dir>/logs/access.log. On a host whose logrotate covers /var/log/nginx/*.log: /var/log/nginx/dstack.access.log',
  },
  apiTokenFile: {
    kind: 'string',
    default: undefined,
    help: 'file holding a token the management routes (/api/v1/*, /metrics, /api/stats/collect) require as `Authorization: Bearer`',
  },
  insecureOpenApi: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'false',
    help: '`true` allows a non-loopback --api-host without --api-token-file (only behind a firewall you trust); otherwise such a start is refused with DP_ERR_OPEN_API',
  },
  serverUrl: {
    kind: 'string',
    default: undefined,
    help: 'the control server that answers token checks (`http://host:port`, `unix:/path.sock`, or `unix-dir:/dir`: any live `*.sock` in it, one per server process as dstack forwards them; stale ones are unlinked); without it every auth: true request is refused',
  },
  authCacheTtl: {
    kind: 'seconds',
    default: 60,
    help: 'seconds a positive token check is cached (keyed by a hash of the token); refusals are never cached',
  },
  authTimeout: { kind: 'seconds', default: 5, help: 'seconds to wait for the control server before refusing the request' },
  sshKeepaliveInterval: { kind: 'seconds', default: 15, help: 'seconds between SSH keepalives to each replica' },
  sshKeepaliveCountMax: {
    kind: 'count',
    default: 3,
    help: 'unanswered keepalives after which a replica connection counts as dead and leaves rotation',
  },
  sshShareConnections: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'true',
    help: "`true`: replicas reached through identical hops (host, port, user, key, pinned fingerprint) share one SSH connection, each request on its own channel, as OpenSSH's ControlMaster does; `false`: a connection per replica (a jump host that limits channels per connection)",
  },
  drainPeriod: {
    kind: 'seconds',
    default: 30,
    help: "seconds a removed replica's open connections may finish before they are closed, and a gateway another one took over from finishes what Nginx still sends it",
  },
  acmeChallengePeers: {
    kind: 'string',
    default: undefined,
    help: "the other replicas of this gateway behind one DNS name or load balancer, http(s)://host[:port] comma-separated: an ACME HTTP-01 challenge this gateway does not have is asked of them, so each replica can get its certificate from Let's Encrypt whichever one the validation reaches (dstack's replicated gateways, each registered on its own)",
  },
  takeOver: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'false',
    help: "`true`: start beside the gateway running on this state dir (system Nginx) and take over from it without dropping a request: converge from the stored document with its own tunnels, point Nginx's data-plane socket at this process, tell the old one to stop (it finishes what Nginx still sends it, at most --drain-period), then listen on its API port; with no gateway running it starts as usual; `false`: refuse to start while another gateway serves this state dir",
  },
  successorWait: {
    kind: 'seconds',
    default: 0,
    allowZero: true,
    help: 'seconds a gateway told to stop goes on serving Nginx (system Nginx only) until one started with --take-over true takes over from it, so a restart drops no request; it then finishes what it has in flight (at most --drain-period). Its API and loops go on meanwhile, so the management API changes hands within milliseconds. 0: it stops serving at once. A private Nginx stops with its gateway, so there it has no effect',
  },
  certbotBin: { kind: 'string', default: 'certbot', help: 'the certbot program' },
  certbotTimeout: { kind: 'seconds', default: 40, help: 'seconds after which a certbot run is killed with its whole process group' },
  certbotDir: {
    kind: 'string',
    default: undefined,
    help: "certbot's config (unless --certbot-config-dir), work and logs dirs go under this dir; default <state-dir>/certbot",
  },
  certbotConfigDir: {
    kind: 'string',
    default: undefined,
    help: "certbot's --config-dir (accounts, live/<domain>/, renewal/); default <certbot-dir>/config. /etc/letsencrypt reuses the certificates certbot already holds there: a valid one is served without an ACME request",
  },
  acmeCaBundle: {
    kind: 'string',
    default: undefined,
    help: 'CA bundle certbot trusts for the ACME server (a private ACME CA, or Pebble in tests); default: the system trust store',
  },
  dnsPreflight: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'true',
    help: 'check that a domain resolves before spending an ACME attempt on it',
  },
  dstackCompat: {
    kind: 'enum',
    values: ['true', 'false'],
    default: 'false',
    help: "`true` serves dstack's gateway API (/api/registry/*, /api/services/list, /api/config, GET /) on the API listener, so an unmodified dstack server drives the gateway; those routes take no token, so --api-host must be loopback (dstack's server comes in through its SSH tunnel), and /api/stats/collect then answers without the API token",
  },
  dstackCompatReplicaWait: {
    kind: 'seconds',
    default: 20,
    help: "seconds a dstack replicas/register waits for the replica's tunnel to be Ready before it answers 400 and removes the replica again",
  },
  dstackCompatTls: {
    kind: 'enum',
    values: ['wait', 'async'],
    default: 'wait',
    help: 'dstack https registrations: `wait` answers once the certificate is there or its first attempt failed (then 400 and the registration undone); `async` answers at once, serves HTTP and keeps trying',
  },
  logLevel: {
    kind: 'enum',
    values: ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'],
    default: 'info',
    help: 'JSON log level',
  },
} as const satisfies Record<keyof GatewayOptions, OptionSpec>;

export function resolveOptions(sources: OptionSources): GatewayOptions {
  const options: GatewayOptions = resolveTable(OPTION_SPECS, sources);
  if (options.httpPort === options.httpsPort) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `--http-port and --https-port are both ${options.httpPort}`);
  }
  if (options.nginx === 'system' && !options.sitesDir) {
    throw new ProxyError('DP_ERR_BAD_OPTION', '--sites-dir is required with --nginx system');
  }
  if (options.defaultServer === 'false' && options.healthCheckOk === 'true') {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      "--health-check-ok true answers on our default server, and --default-server false renders none: drop one of the two (the distribution's default site then answers health checks)",
    );
  }
  if (options.accessLog !== undefined) checkAccessLog(options.accessLog);
  parseAcmePeers(options.acmeChallengePeers);
  parseTrustedProxies(options.trustedProxies);
  return options;
}

/**
 * The access log path is written into every site's `access_log` directive: it must be absolute
 * (Nginx would take a relative one from its prefix, the stats collector from our cwd) and
 * writable as an Nginx string (no `$`, which Nginx would interpolate, no control characters).
 */
function checkAccessLog(path: string): void {
  if (!isAbsolute(path) || path.endsWith('/')) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `--access-log must be the absolute path of a file, got ${JSON.stringify(path)}`);
  }
  try {
    quote(path);
  } catch (err) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `--access-log ${JSON.stringify(path)} cannot be written into the Nginx sites: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}
