#!/usr/bin/env node
// Regenerates docs/configuration.md from the option specs (run after `npm run build`).
// test/gateway/options.test.ts fails when the doc and the code disagree.
import { writeFileSync } from 'node:fs';
import { OPTION_SPECS, envName, kebab } from '../dist/src/gateway/options.js';

let out = `# Gateway configuration

Every option of \`dstack-proxy gateway\`, its default and what it does. Sources, later ones winning:
defaults < \`--config FILE\` (YAML, the camelCase key) < environment (\`DSTACK_PROXY_*\`) < flags.
A bad value stops the start with a sentence naming the option and where it came from.
Regenerate with \`npm run build && node scripts/config-doc.mjs\`.

| flag | config key | environment | default | meaning |
|---|---|---|---|---|
`;
for (const [name, spec] of Object.entries(OPTION_SPECS)) {
  const def = spec.default === undefined ? '—' : spec.default === '' ? '`""`' : `\`${spec.default}\``;
  const values = spec.values ? ` (one of ${spec.values.map((v) => `\`${v}\``).join(', ')})` : '';
  out += `| \`--${kebab(name)}\` | \`${name}\` | \`${envName(name)}\` | ${def} | ${spec.help.replace(/\|/g, '\\|')}${values} |\n`;
}
out += `
## Nginx's workers and the paths they open

Nginx's worker processes face the internet, so they never run as root. A private Nginx started by
a root gateway runs its master as root (to bind 80/443) and its workers as \`--nginx-user\`
(\`www-data\`); with the system Nginx, \`--nginx-user\` names the user its workers already run
as. The workers open only a few paths themselves, all in \`--nginx-worker-dir\`
(\`<state-dir>-nginx\`): \`sockets/\` (the balancer sockets, 0660), \`acme-webroot/\` and \`tmp/\`
(request bodies larger than 16 KiB). The dirs are owned by the gateway's user and the workers'
group, mode 0710 (enter, not list). Every parent of that dir must let the workers in: when one does
not (a home dir, a 0700 scratch dir), the gateway refuses to start and names it. The state dir
stays 0700: site files, certificates and logs are opened by the master.

## The internal listener

The gateway's own model API reaches its Nginx on a Unix socket, \`<state-dir>/nginx-internal/nginx.sock\`
(the directory is 0700, the gateway's user's only). Every service site has a second server on it:
no \`auth_request\` (the model API checked the token), no HTTPS redirect, and the client address from
\`X-Real-IP\` (\`set_real_ip_from unix:\`), so the service's rate limits count per client there too.
No TCP address is trusted anywhere. \`<state-dir>/nginx-internal/entrypoint-key.conf\` (0600) holds
the key entrypoint sites send to the model API so it can tell their \`X-Real-IP\` from a client's.
`;
writeFileSync(new URL('../docs/configuration.md', import.meta.url), out);
