import { startGateway } from '../daemon/gateway.js';
import { helpLines, parseTableFlags } from '../option-table.js';
import { runUntilSignal } from '../daemon/signals.js';
import { OPTION_SPECS, resolveOptions } from '../gateway/options.js';
import { checkGatewayConfig } from './gateway-check.js';
import type { Command } from './command.js';

export const gatewayCommand: Command = {
  name: 'gateway',
  summary: 'run the gateway daemon',
  help: `Usage: dstack-proxy gateway [--config FILE] [options]

Run the gateway: accept desired-state documents on the API and converge Nginx to them.
Options come from defaults < --config FILE (YAML, camelCase keys) < env DSTACK_PROXY_* < flags.

Options:
  --config FILE            YAML file with any of the options below (camelCase keys)
  --check                  resolve the options and validate the stored state, start nothing
${helpLines(OPTION_SPECS)}
  -h, --help               show this help

Stops gracefully on SIGINT/SIGTERM. See docs/configuration.md.`,
  async run(argv, io) {
    const check = argv.includes('--check');
    const options = resolveOptions({
      ...parseTableFlags(
        OPTION_SPECS,
        argv.filter((a) => a !== '--check'),
      ),
      env: io.env,
    });
    if (check) return checkGatewayConfig(options, io);
    const gateway = await startGateway(options);
    // Handlers first, then the line saying we are up: whoever signals on reading it reaches them.
    const stopped = runUntilSignal('gateway', gateway, io.stderr);
    io.stderr(`dstack-proxy gateway: API on ${gateway.apiUrl}, nginx ${options.nginx} (HTTP port ${options.httpPort})\n`);
    await stopped;
    return 0;
  },
};
