#!/usr/bin/env node
// Regenerates docs/configuration.md from the option specs (run after `npm run build`).
// test/gateway/options.test.ts fails when the doc and the code disagree.
import { readFileSync, writeFileSync } from 'node:fs';
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
const target = new URL('../docs/configuration.md', import.meta.url);
// Hand-written sections after the generated table (from the first `## ` heading on) are kept.
const previous = readFileSync(target, 'utf8');
const kept = previous.indexOf('\n## ');
if (kept !== -1) out += previous.slice(kept);
writeFileSync(target, out);
