// `dstack-proxy server-proxy` options, through the same table as the gateway's: defaults <
// --config FILE (YAML) < env DSTACK_PROXY_* < flags. docs/configuration.md documents each
// (test/server-proxy/options.test.ts checks).

import { ProxyError } from '../errors.js';
import { resolveTable, type OptionSources, type OptionSpec } from '../option-table.js';
import type { ServerProxyServerOptions } from './server-proxy.js';

export interface ServerProxyFlags {
  db: string | undefined;
  host: string;
  port: number;
  serverUrl: string | undefined;
  stateDir: string | undefined;
  apiTokenFile: string | undefined;
  apiPort: number | undefined;
  apiHost: string | undefined;
  insecureOpenApi: boolean;
  connectTimeout: number;
  readTimeout: number;
  resyncInterval: number;
  logLevel: 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';
}

export const SERVER_PROXY_OPTION_SPECS = {
  db: { kind: 'string', default: undefined, help: 'required: `sqlite:PATH`, `postgres://user@host/db`, or a state directory (state.json)' },
  host: {
    kind: 'string',
    default: '127.0.0.1',
    help: "address of the proxy's listener (`/proxy/services/`, `/proxy/models/`, `/healthz`, `/readyz`, and the management routes with --api-token-file or --insecure-open-api)",
  },
  port: { kind: 'port', default: 8080, help: 'its port, 0 for any' },
  serverUrl: {
    kind: 'string',
    default: undefined,
    help: 'control server for auth: true services, `http(s)://…`, `unix:/path` or `unix-dir:/dir` (any live `*.sock` in it) (POST /api/projects/<p>/get, answers cached 60 s, fail closed); without it they are refused',
  },
  stateDir: {
    kind: 'string',
    default: undefined,
    help: 'balancer sockets and scratch files; default a temporary directory, removed at exit',
  },
  apiTokenFile: {
    kind: 'string',
    default: undefined,
    help: "file holding a token (at least 16 characters) that /api/v1/state, /api/v1/status, /metrics and /api/stats/collect require as `Authorization: Bearer`; without it (and without --api-port) they are off on the proxy's listener",
  },
  apiPort: {
    kind: 'port',
    default: undefined,
    help: "serve those management routes on a listener of their own at --api-host:--api-port (0 for any); --port's listener then answers them 404",
  },
  apiHost: { kind: 'string', default: undefined, help: 'address of the --api-port listener (only with --api-port); default 127.0.0.1' },
  insecureOpenApi: {
    kind: 'switch',
    default: false,
    help: "serve the management routes without --api-token-file: on the proxy's listener (any address), or on a non-loopback --api-host (only with nothing proxying to it, behind a firewall you trust); without it they are off on the proxy's listener, and a non-loopback --api-host is refused with DP_ERR_OPEN_API",
  },
  connectTimeout: { kind: 'seconds', default: 10, help: 'seconds to open a connection to a replica, then 504' },
  readTimeout: {
    kind: 'seconds',
    default: 300,
    help: "seconds to wait for the replica's headers / between body chunks, then 504; a WebSocket with no traffic either way for this long is closed; a service's readTimeout overrides it",
  },
  resyncInterval: { kind: 'seconds', default: 60, help: 'seconds between periodic passes that repair drift (tunnels)' },
  logLevel: {
    kind: 'enum',
    values: ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'],
    default: 'info',
    help: 'JSON log level',
  },
} as const satisfies Record<keyof ServerProxyFlags, OptionSpec>;

export function resolveServerProxyOptions(sources: OptionSources): ServerProxyServerOptions {
  const f: ServerProxyFlags = resolveTable(SERVER_PROXY_OPTION_SPECS, sources);
  if (!f.db) throw new ProxyError('DP_ERR_BAD_OPTION', '--db is required (sqlite:PATH or postgres://…)');
  if (f.apiHost !== undefined && f.apiPort === undefined) {
    throw new ProxyError('DP_ERR_BAD_OPTION', '--api-host needs --api-port (management on its own listener)');
  }
  return {
    db: f.db,
    host: f.host,
    port: f.port,
    ...(f.serverUrl ? { serverUrl: f.serverUrl } : {}),
    ...(f.stateDir ? { stateDir: f.stateDir } : {}),
    ...(f.apiTokenFile ? { apiTokenFile: f.apiTokenFile } : {}),
    ...(f.apiPort !== undefined ? { apiPort: f.apiPort } : {}),
    ...(f.apiHost ? { apiHost: f.apiHost } : {}),
    insecureOpenApi: f.insecureOpenApi,
    connectTimeoutMs: Math.round(f.connectTimeout * 1000),
    readTimeoutMs: Math.round(f.readTimeout * 1000),
    resyncIntervalMs: Math.round(f.resyncInterval * 1000),
    logLevel: f.logLevel,
  };
}
