// The gateway config a host runs (<root>/config.yaml), read with the gateway's own option
// table, so install and update see exactly the options the daemon will start with.

import { resolveOptions, type GatewayOptions } from '../gateway/options.js';

/** The options the daemon resolves from `file` (and no flags or environment). */
export function readGatewayConfig(file: string): GatewayOptions {
  return resolveOptions({ configFile: file, env: {} });
}

/** Where the gateway's /readyz answers, from its API listener options. */
export function readyUrl(options: Pick<GatewayOptions, 'apiHost' | 'apiPort'>): string {
  const host = options.apiHost === '0.0.0.0' || options.apiHost === '' ? '127.0.0.1' : options.apiHost === '::' ? '::1' : options.apiHost;
  return `http://${host.includes(':') ? `[${host}]` : host}:${options.apiPort}/readyz`;
}
