// `dstack-proxy server-proxy`: the in-server proxy as its own process (src/server-proxy/server.ts).

import { parseArgs } from 'node:util';
import { startServerProxy, type ServerProxyServerOptions } from '../server-proxy/server.js';
import { UsageError, type Command } from './command.js';

export const serverProxyCommand: Command = {
  name: 'server-proxy',
  summary: 'run the in-server proxy (document in SQLite or PostgreSQL, no Nginx)',
  help: `Usage: dstack-proxy server-proxy --db sqlite:PATH|postgres://… [options]

Serve services at /proxy/services/<project>/<run>/ from the document in a database, through
SSH tunnels (or direct addresses) opened in this process. PUT the document to /api/v1/state
(as on the gateway) or write the row directly (docs/database.md). Several processes on one
PostgreSQL serve the same document.

The management routes (/api/v1/state, /api/v1/status, /api/stats/collect) rewrite or reveal all
routing: without --api-token-file they are served on a loopback address only. To serve the proxy
on the network, give --api-token-file, or move management to a loopback --api-port.

Options:
  --db URL                  sqlite:PATH | postgres://user@host/db | a state directory (required; env DSTACK_PROXY_DB)
  --host HOST               listen address (default: 127.0.0.1)
  --port PORT               listen port, 0 for any (default: 8080)
  --server-url URL          control server for auth: true services, http(s)://… or unix:/path
                            (POST /api/projects/<p>/get, answers cached 60 s, fail closed)
  --state-dir DIR           balancer sockets and scratch files (default: a temporary directory)
  --api-token-file FILE     require this bearer token on /api/v1/* and /api/stats/collect
  --api-port PORT           serve /api/v1/* and /api/stats/collect on their own listener instead of
                            --port's (which then answers them 404); 0 for any
  --api-host HOST           address of the --api-port listener (default: 127.0.0.1)
  --insecure-open-api       allow the management routes without --api-token-file on a non-loopback
                            address; without it such a start is refused (DP_ERR_OPEN_API)
  --connect-timeout SEC     opening a connection to a replica, then 504 (default: 10)
  --read-timeout SEC        waiting for the replica's headers / between body chunks, then 504; a WebSocket
                            with no traffic either way for this long is closed (default: 300)
  --log-level LEVEL         trace|debug|info|warn|error (default: info)
  -h, --help                show this help

Stops gracefully on SIGINT/SIGTERM.`,
  async run(argv, io) {
    const { values: v } = parseArgs({
      args: argv,
      options: {
        db: { type: 'string' },
        host: { type: 'string' },
        port: { type: 'string' },
        'server-url': { type: 'string' },
        'state-dir': { type: 'string' },
        'api-token-file': { type: 'string' },
        'api-port': { type: 'string' },
        'api-host': { type: 'string' },
        'insecure-open-api': { type: 'boolean' },
        'connect-timeout': { type: 'string' },
        'read-timeout': { type: 'string' },
        'log-level': { type: 'string' },
      },
      strict: true,
    });
    const db = v.db ?? io.env.DSTACK_PROXY_DB;
    if (!db) throw new UsageError('--db is required (sqlite:PATH or postgres://…)');
    const options: ServerProxyServerOptions = { db };
    if (v.host) options.host = v.host;
    if (v.port !== undefined) options.port = intFlag('--port', v.port, 0, 65535);
    if (v['server-url']) options.serverUrl = v['server-url'];
    if (v['state-dir']) options.stateDir = v['state-dir'];
    if (v['api-token-file']) options.apiTokenFile = v['api-token-file'];
    if (v['api-port'] !== undefined) options.apiPort = intFlag('--api-port', v['api-port'], 0, 65535);
    if (v['api-host']) {
      if (v['api-port'] === undefined) throw new UsageError('--api-host needs --api-port (management on its own listener)');
      options.apiHost = v['api-host'];
    }
    if (v['insecure-open-api']) options.insecureOpenApi = true;
    if (v['connect-timeout'] !== undefined) options.connectTimeoutMs = secondsFlag('--connect-timeout', v['connect-timeout']);
    if (v['read-timeout'] !== undefined) options.readTimeoutMs = secondsFlag('--read-timeout', v['read-timeout']);
    if (v['log-level']) options.logLevel = v['log-level'];

    const proxy = await startServerProxy(options);
    const api = proxy.apiUrl === proxy.url ? '' : `, management API on ${proxy.apiUrl}`;
    io.stderr(`dstack-proxy server-proxy: listening on ${proxy.url}${api} (generation ${proxy.current().generation})\n`);
    await new Promise<void>((resolve) => {
      const stop = (signal: string): void => {
        io.stderr(`dstack-proxy server-proxy: ${signal}, shutting down\n`);
        process.off('SIGINT', onInt);
        process.off('SIGTERM', onTerm);
        proxy.close().then(resolve, (err: unknown) => {
          io.stderr(`dstack-proxy server-proxy: shutdown failed: ${(err as Error).message}\n`);
          resolve();
        });
      };
      const onInt = (): void => stop('SIGINT');
      const onTerm = (): void => stop('SIGTERM');
      process.on('SIGINT', onInt);
      process.on('SIGTERM', onTerm);
    });
    return 0;
  },
};

function intFlag(name: string, text: string, min: number, max: number): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < min || n > max) throw new UsageError(`${name} must be an integer in ${min}..${max}, got ${text}`);
  return n;
}

function secondsFlag(name: string, text: string): number {
  const n = Number(text);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${name} must be a positive number of seconds, got ${text}`);
  return Math.round(n * 1000);
}
