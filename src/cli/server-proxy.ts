// `dstack-proxy server-proxy`: the in-server proxy as its own process (src/daemon/server-proxy.ts).

import { ProxyError } from '../errors.js';
import { helpLines, parseTableFlags } from '../option-table.js';
import { startServerProxy } from '../daemon/server-proxy.js';
import { SERVER_PROXY_OPTION_SPECS, resolveServerProxyOptions } from '../daemon/server-proxy-options.js';
import { runUntilSignal } from '../daemon/signals.js';
import { UsageError, type Command } from './command.js';

export const serverProxyCommand: Command = {
  name: 'server-proxy',
  summary: 'run the in-server proxy (document in SQLite or PostgreSQL, no Nginx)',
  help: `Usage: dstack-proxy server-proxy --db sqlite:PATH|postgres://… [--config FILE] [options]

Serve services at /proxy/services/<project>/<run>/ from the document in a database, through
SSH tunnels (or direct addresses) opened in this process. PUT the document to /api/v1/state
(as on the gateway) or write the row directly (docs/database.md). Several processes on one
PostgreSQL serve the same document.

The management routes (/api/v1/state, /api/v1/status, /metrics, /api/stats/collect) rewrite or reveal all
routing. The proxy's listener serves them only with --api-token-file (they then ask for the token):
a load balancer or TLS terminator on this host makes every proxied request look local, so a
loopback address proves nothing. Without a token they are off there (403 DP_ERR_MANAGEMENT_OFF);
--api-port PORT serves them on a loopback listener of their own, and --insecure-open-api open on
the proxy's listener (only with nothing in front of it).

Options come from defaults < --config FILE (YAML, camelCase keys) < env DSTACK_PROXY_* < flags.

Options:
  --config FILE            YAML file with any of the options below (camelCase keys)
${helpLines(SERVER_PROXY_OPTION_SPECS)}
  -h, --help               show this help

Stops gracefully on SIGINT/SIGTERM. See docs/configuration.md.`,
  async run(argv, io) {
    let options;
    try {
      options = resolveServerProxyOptions({ ...parseTableFlags(SERVER_PROXY_OPTION_SPECS, argv), env: io.env });
    } catch (err) {
      // A bad option is a usage error here (exit 2, with the help), as it always was for this command.
      if (err instanceof ProxyError && err.code === 'DP_ERR_BAD_OPTION') throw new UsageError(err.message);
      throw err;
    }
    const proxy = await startServerProxy(options);
    const api =
      proxy.apiUrl === undefined
        ? ', management API off (no --api-token-file, --api-port or --insecure-open-api)'
        : proxy.apiUrl === proxy.url
          ? ''
          : `, management API on ${proxy.apiUrl}`;
    // Handlers first, then the line saying we are up: whoever signals on reading it reaches them.
    const stopped = runUntilSignal('server-proxy', proxy, io.stderr);
    io.stderr(`dstack-proxy server-proxy: listening on ${proxy.url}${api} (generation ${proxy.current().generation})\n`);
    await stopped;
    return 0;
  },
};
