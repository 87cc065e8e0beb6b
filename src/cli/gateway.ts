import { parseArgs } from 'node:util';
import { startGateway } from '../gateway/gateway.js';
import { OPTION_SPECS, kebab, resolveOptions } from '../gateway/options.js';
import type { Command } from './command.js';

const flagNames = Object.keys(OPTION_SPECS);

export const gatewayCommand: Command = {
  name: 'gateway',
  summary: 'run the gateway daemon',
  help: `Usage: dstack-proxy gateway [--config FILE] [options]

Run the gateway: accept desired-state documents on the API and converge Nginx to them.
Options come from defaults < --config FILE (YAML, camelCase keys) < env DSTACK_PROXY_* < flags.

Options:
  --config FILE            YAML file with any of the options below (camelCase keys)
${flagNames
  .map((n) => {
    const spec = OPTION_SPECS[n as keyof typeof OPTION_SPECS];
    const def = spec.default === undefined ? '' : ` (default: ${spec.default === '' ? '""' : String(spec.default)})`;
    return `  --${kebab(n).padEnd(22)} ${spec.help}${def}`;
  })
  .join('\n')}
  -h, --help               show this help

Stops gracefully on SIGINT/SIGTERM. See docs/configuration.md.`,
  async run(argv, io) {
    const { values } = parseArgs({
      args: argv,
      options: {
        config: { type: 'string' },
        ...Object.fromEntries(flagNames.map((n) => [kebab(n), { type: 'string' as const }])),
      },
      strict: true,
    });
    const raw = values as Record<string, string | undefined>;
    const flags = Object.fromEntries(flagNames.map((n) => [n, raw[kebab(n)]]));
    const options = resolveOptions({ flags, env: io.env, ...(raw.config ? { configFile: raw.config } : {}) });
    const gateway = await startGateway(options);
    io.stderr(`dstack-proxy gateway: API on ${gateway.apiUrl}, nginx ${options.nginx} (HTTP port ${options.httpPort})\n`);
    await new Promise<void>((resolve) => {
      const stop = (signal: string): void => {
        io.stderr(`dstack-proxy gateway: ${signal}, shutting down\n`);
        process.off('SIGINT', onInt);
        process.off('SIGTERM', onTerm);
        gateway.close().then(resolve, (err: unknown) => {
          io.stderr(`dstack-proxy gateway: shutdown failed: ${(err as Error).message}\n`);
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
