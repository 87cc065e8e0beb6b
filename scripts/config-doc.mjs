#!/usr/bin/env node
// Regenerates the option tables of docs/configuration.md from the option specs of both daemons
// (run after `npm run build`). test/gateway/options.test.ts and test/server-proxy/options.test.ts
// fail when the doc and the code disagree.
import { readFileSync, writeFileSync } from 'node:fs';
import { envName, kebab } from '../dist/src/option-table.js';
import { OPTION_SPECS } from '../dist/src/gateway/options.js';
import { SERVER_PROXY_OPTION_SPECS } from '../dist/src/daemon/server-proxy-options.js';

const GENERATED = ['`dstack-proxy gateway`', '`dstack-proxy server-proxy`'];

function table(specs) {
  let out = '| flag | config key | environment | default | meaning |\n|---|---|---|---|---|\n';
  for (const [name, spec] of Object.entries(specs)) {
    const def = spec.default === undefined ? '—' : spec.default === '' ? '`""`' : `\`${spec.default}\``;
    const values = spec.values ? ` (one of ${spec.values.map((v) => `\`${v}\``).join(', ')})` : '';
    const flag = spec.kind === 'switch' ? ' (a flag without a value; `true`/`false` in the file and the environment)' : '';
    out += `| \`--${kebab(name)}\` | \`${name}\` | \`${envName(name)}\` | ${def} | ${spec.help.replace(/\|/g, '\\|')}${values}${flag} |\n`;
  }
  return out;
}

let out = `# Configuration

Every option of the two daemons, \`dstack-proxy gateway\` and \`dstack-proxy server-proxy\`, its
default and what it does. Both take them the same way, later sources winning: defaults <
\`--config FILE\` (YAML, the camelCase key) < environment (\`DSTACK_PROXY_*\`) < flags. A bad value
stops the start with a sentence naming the option and where it came from.
Regenerate with \`npm run build && node scripts/config-doc.mjs\`.

## \`dstack-proxy gateway\`

${table(OPTION_SPECS)}
## \`dstack-proxy server-proxy\`

The management routes (\`/api/v1/state\`, \`/api/v1/status\`, \`/metrics\`, \`/api/stats/collect\`) are
served on \`--host:--port\` only with \`--api-token-file\` (they then ask for the token) or
\`--insecure-open-api\`: the proxy's listener carries proxied requests, and a load balancer or TLS
terminator on the same host makes every one of them come from loopback. Without either they are
off there (403 \`DP_ERR_MANAGEMENT_OFF\`, and a warning at start naming the ways to turn them on).
\`--api-port\` moves them to a listener of their own, loopback unless \`--api-host\` says otherwise;
a non-loopback \`--api-host\` without a token is refused (\`DP_ERR_OPEN_API\`) unless
\`--insecure-open-api\` is given.

${table(SERVER_PROXY_OPTION_SPECS)}`;

// Hand-written sections (every \`## \` section that is not one of the generated tables) are kept.
const target = new URL('../docs/configuration.md', import.meta.url);
const previous = readFileSync(target, 'utf8');
for (const section of previous.split('\n## ').slice(1)) {
  if (!GENERATED.some((title) => section.startsWith(title))) out += `\n## ${section.replace(/\n*$/, '\n')}`;
}
writeFileSync(target, out);
