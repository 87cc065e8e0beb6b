// The option table both daemons are configured by: defaults < --config FILE (YAML) < env
// DSTACK_PROXY_* < flags. Each command declares its table (name → kind, default, help); this
// module turns it into parseArgs flags, the --help lines, docs/configuration.md rows and
// checked values. Every option is checked at the door; a bad one stops the start with a
// sentence naming it and where it came from.

import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { parse as parseYaml } from 'yaml';
import { ProxyError } from './errors.js';

/** `switch` is a flag without a value (`--insecure-open-api`); in env and file: true or false. */
export type OptionKind = 'string' | 'port' | 'seconds' | 'count' | 'enum' | 'switch';

export interface OptionSpec {
  kind: OptionKind;
  default: string | number | boolean | undefined;
  values?: readonly string[];
  /** For 'seconds': 0 is allowed too (it turns the behaviour off). */
  allowZero?: boolean;
  help: string;
}

export type OptionTable = Readonly<Record<string, OptionSpec>>;

/** What an option of this spec resolves to: an enum one of its values, a switch a boolean, a number for the rest. */
type ValueOf<S extends OptionSpec> = S['kind'] extends 'enum'
  ? S['values'] extends readonly (infer V)[]
    ? V
    : string
  : S['kind'] extends 'string'
    ? string
    : S['kind'] extends 'switch'
      ? boolean
      : number;

/**
 * The options a table resolves to, typed from the table itself (declared `as const`): an option
 * without a default may be undefined, one with a default never is.
 */
export type Resolved<T extends OptionTable> = {
  -readonly [K in keyof T]: undefined extends T[K]['default'] ? ValueOf<T[K]> | undefined : ValueOf<T[K]>;
};

/** Where the values come from; `flags` are keyed by option name (camelCase). */
export interface OptionSources {
  flags?: Record<string, string | undefined>;
  env?: NodeJS.ProcessEnv;
  configFile?: string;
}

export function kebab(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

export function envName(name: string): string {
  return `DSTACK_PROXY_${name.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`;
}

/** Every option of `table`, each from the source that wins, checked and coerced. */
export function resolveTable<T extends OptionTable>(table: T, sources: OptionSources): Resolved<T> {
  const fromFile = sources.configFile ? readConfigFile(table, sources.configFile) : {};
  const out: Record<string, unknown> = {};
  for (const [name, spec] of Object.entries(table)) {
    const flag = sources.flags?.[name];
    const env = sources.env?.[envName(name)];
    const file = fromFile[name];
    const [raw, where] =
      flag !== undefined
        ? [flag, `--${kebab(name)}`]
        : env !== undefined
          ? [env, envName(name)]
          : file !== undefined
            ? [file, `${sources.configFile}: ${name}`]
            : [spec.default, 'default'];
    out[name] = raw === undefined ? undefined : coerce(raw, spec, where);
  }
  // coerce() gives each option its kind's type (an enum only one of its values): what Resolved says.
  return out as Resolved<T>;
}

/** argv → the table's flags (by option name) and `--config`; unknown flags fail as usage errors. */
export function parseTableFlags(table: OptionTable, argv: string[]): OptionSources & { flags: Record<string, string | undefined> } {
  const names = Object.keys(table);
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: 'string' },
      ...Object.fromEntries(
        names.map((n) => [kebab(n), { type: table[n]!.kind === 'switch' ? ('boolean' as const) : ('string' as const) }]),
      ),
    },
    strict: true,
  });
  const raw = values as Record<string, string | boolean | undefined>;
  const flags = Object.fromEntries(names.map((n) => [n, raw[kebab(n)] === undefined ? undefined : String(raw[kebab(n)])]));
  return { flags, ...(typeof raw.config === 'string' ? { configFile: raw.config } : {}) };
}

/** The --help lines of a table, one per option with its default. */
export function helpLines(table: OptionTable): string {
  return Object.entries(table)
    .map(([n, spec]) => {
      const def = spec.default === undefined ? '' : ` (default: ${spec.default === '' ? '""' : String(spec.default)})`;
      return `  --${kebab(n).padEnd(22)} ${spec.help}${def}`;
    })
    .join('\n');
}

function readConfigFile(table: OptionTable, file: string): Record<string, unknown> {
  let data: unknown;
  try {
    data = parseYaml(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `cannot read config ${file}: ${(err as Error).message.split('\n')[0]}`);
  }
  if (data === null || data === undefined) return {};
  if (typeof data !== 'object' || Array.isArray(data)) throw new ProxyError('DP_ERR_BAD_OPTION', `config ${file} must be a YAML mapping`);
  for (const key of Object.keys(data)) {
    if (!(key in table)) throw new ProxyError('DP_ERR_BAD_OPTION', `config ${file}: unknown option "${key}"`);
  }
  return data as Record<string, unknown>;
}

function coerce(raw: unknown, spec: OptionSpec, where: string): string | number | boolean {
  const bad = (why: string): never => {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${where}: ${why}; got ${JSON.stringify(raw)}`);
  };
  switch (spec.kind) {
    case 'string':
      if (typeof raw !== 'string' && typeof raw !== 'number') bad('must be a string');
      return String(raw);
    case 'enum':
      if (!spec.values?.includes(String(raw))) bad(`must be one of ${spec.values?.join(', ')}`);
      return String(raw);
    case 'switch':
      if (raw === true || raw === 'true') return true;
      if (raw === false || raw === 'false') return false;
      return bad('must be true or false');
    case 'port': {
      const n = Number(raw);
      if (!Number.isInteger(n) || n < 0 || n > 65535) bad('must be a port number 0-65535 (0 = pick a free one)');
      return n;
    }
    case 'count': {
      const n = Number(raw);
      if (!Number.isInteger(n) || n < 1 || n > 1000) bad('must be a whole number from 1 to 1000');
      return n;
    }
    case 'seconds': {
      const n = Number(raw);
      const min = spec.allowZero ? 0 : Number.MIN_VALUE;
      if (!Number.isFinite(n) || n < min || n > 86_400) bad(`must be a number of seconds ${spec.allowZero ? '≥ 0' : '> 0'} and ≤ 86400`);
      return n;
    }
  }
}
