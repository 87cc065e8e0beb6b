// `dstack-proxy server-proxy` options come through the same table as the gateway's: defaults <
// --config FILE < env DSTACK_PROXY_* < flags, each option documented in docs/configuration.md.

import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { envName, kebab, type OptionTable } from '../../src/option-table.js';
import { SERVER_PROXY_OPTION_SPECS, resolveServerProxyOptions } from '../../src/daemon/server-proxy-options.js';
import { runCli, spawnCli } from '../helpers/cli.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir();
afterAll(() => t.cleanup());

describe('server-proxy options', () => {
  it('has the defaults the flags always had', () => {
    expect(resolveServerProxyOptions({ flags: { db: 'sqlite:x.db' } })).toEqual({
      db: 'sqlite:x.db',
      host: '127.0.0.1',
      port: 8080,
      insecureOpenApi: false,
      connectTimeoutMs: 10_000,
      readTimeoutMs: 300_000,
      resyncIntervalMs: 60_000,
      logLevel: 'info',
    });
  });

  it('takes defaults < config file < env < flags', () => {
    const file = path.join(t.dir, 'sp.yaml');
    writeFileSync(file, 'db: sqlite:file.db\nport: 9001\nhost: 127.0.0.2\nreadTimeout: 5\ninsecureOpenApi: true\napiPort: 9100\n');
    const o = resolveServerProxyOptions({
      configFile: file,
      env: {
        DSTACK_PROXY_PORT: '9002',
        DSTACK_PROXY_READ_TIMEOUT: '7',
        DSTACK_PROXY_DB: 'sqlite:env.db',
        DSTACK_PROXY_INSECURE_OPEN_API: 'false',
      },
      flags: { readTimeout: '9.5', connectTimeout: '0.25' },
    });
    expect(o).toMatchObject({
      db: 'sqlite:env.db',
      host: '127.0.0.2',
      port: 9002,
      apiPort: 9100,
      readTimeoutMs: 9_500,
      connectTimeoutMs: 250,
      insecureOpenApi: false,
    });
    // A switch given on the command line is `true`, whatever the file and env say.
    expect(
      resolveServerProxyOptions({ configFile: file, env: { DSTACK_PROXY_INSECURE_OPEN_API: 'false' }, flags: { insecureOpenApi: 'true' } }),
    ).toMatchObject({
      insecureOpenApi: true,
    });
  });

  it.each([
    [{ flags: {} }, /--db is required \(sqlite:PATH or postgres:\/\/…\)/],
    [{ flags: { db: 'sqlite:x.db', port: '70000' } }, /--port: must be a port number/],
    [{ flags: { db: 'sqlite:x.db', apiHost: '127.0.0.1' } }, /--api-host needs --api-port \(management on its own listener\)/],
    [
      { flags: { db: 'sqlite:x.db' }, env: { DSTACK_PROXY_CONNECT_TIMEOUT: '0' } },
      /DSTACK_PROXY_CONNECT_TIMEOUT: must be a number of seconds/,
    ],
    [
      { flags: { db: 'sqlite:x.db' }, env: { DSTACK_PROXY_INSECURE_OPEN_API: 'yes' } },
      /DSTACK_PROXY_INSECURE_OPEN_API: must be true or false/,
    ],
    [{ flags: { db: 'sqlite:x.db', logLevel: 'loud' } }, /--log-level: must be one of trace/],
  ])('rejects %j with DP_ERR_BAD_OPTION and a sentence naming the option', (sources, message) => {
    expect(() => resolveServerProxyOptions(sources)).toThrow(message);
    expect(() => resolveServerProxyOptions(sources)).toThrow(expect.objectContaining({ code: 'DP_ERR_BAD_OPTION' }));
  });

  it('documents every option with its flag, env name and default in the server-proxy section of docs/configuration.md', () => {
    const doc = readFileSync('docs/configuration.md', 'utf8');
    const section = doc.slice(doc.indexOf('## `dstack-proxy server-proxy`'));
    const rows = section.slice(0, section.indexOf('\n## ', 1)).split('\n');
    for (const [name, spec] of Object.entries(SERVER_PROXY_OPTION_SPECS as OptionTable)) {
      const row = rows.find((l) => l.startsWith(`| \`--${kebab(name)}\` |`));
      expect(row, name).toBeDefined();
      expect(row).toContain(`\`${envName(name)}\``);
      if (spec.default !== undefined && spec.default !== '') expect(row).toContain(`\`${String(spec.default)}\``);
    }
  });

  it('the built CLI listens where file < env < flag say, and answers a bad option with exit 2 and the help', async () => {
    const [filePort, envPort, flagPort] = (await freePorts(3)) as [number, number, number];
    const file = path.join(t.dir, 'cli.yaml');
    writeFileSync(file, `port: ${filePort}\nlogLevel: warn\nstateDir: ${path.join(t.dir, 'cli-state')}\n`);
    const env = { DSTACK_PROXY_DB: `sqlite:${path.join(t.dir, 'cli.db')}` };
    const listening = async (args: string[], extra: Record<string, string> = {}): Promise<number> => {
      const proc = spawnCli(['server-proxy', '--config', file, ...args], { env: { ...env, ...extra } });
      try {
        const [, url] = await proc.waitFor(/listening on (http:\/\/[^\s,]+)/);
        return Number(new URL(url!).port);
      } finally {
        expect(await proc.stop()).toBe(0);
      }
    };
    expect(await listening([])).toBe(filePort);
    expect(await listening([], { DSTACK_PROXY_PORT: String(envPort) })).toBe(envPort);
    expect(await listening(['--port', String(flagPort)], { DSTACK_PROXY_PORT: String(envPort) })).toBe(flagPort);

    const bad = await runCli(['server-proxy', '--config', file, '--port', 'eighty'], { env });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--port: must be a port number 0-65535');
    expect(bad.stderr).toContain('Usage: dstack-proxy server-proxy');
  });
});
