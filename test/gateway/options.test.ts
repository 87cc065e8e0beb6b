import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { OPTION_SPECS, envName, kebab, resolveOptions } from '../../src/gateway/options.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir();
afterAll(() => t.cleanup());

describe('gateway options', () => {
  it('has the documented defaults', () => {
    const o = resolveOptions({});
    expect(o).toMatchObject({
      apiHost: '127.0.0.1',
      apiPort: 8000,
      nginx: 'private',
      httpPort: 80,
      httpsPort: 443,
      resyncInterval: 60,
      proxyReadTimeout: 300,
    });
  });

  it('takes defaults < config file < env < flags', () => {
    const file = path.join(t.dir, 'gw.yaml');
    writeFileSync(file, 'apiPort: 9001\nhttpPort: 8081\nresyncInterval: 5\n');
    const o = resolveOptions({
      configFile: file,
      env: { DSTACK_PROXY_HTTP_PORT: '8082', DSTACK_PROXY_RESYNC_INTERVAL: '7' },
      flags: { resyncInterval: '9' },
    });
    expect(o).toMatchObject({ apiPort: 9001, httpPort: 8082, resyncInterval: 9 });
  });

  it.each([
    [{ flags: { apiPort: '70000' } }, /--api-port: must be a port number/],
    [{ flags: { nginx: 'docker' } }, /--nginx: must be one of private, system/],
    [{ env: { DSTACK_PROXY_RESYNC_INTERVAL: '0' } }, /DSTACK_PROXY_RESYNC_INTERVAL: must be a number of seconds/],
    [{ flags: { nginx: 'system' } }, /--sites-dir is required with --nginx system/],
    [{ flags: { httpPort: '8080', httpsPort: '8080' } }, /both 8080/],
    [
      { flags: { acmeChallengePeers: 'http://10.0.0.2,http://10.0.0.3/path' } },
      /--acme-challenge-peers: entry 2 .* without credentials or a path/,
    ],
    [{ flags: { acmeChallengePeers: 'ftp://10.0.0.2' } }, /--acme-challenge-peers: entry 1 .* must be http\(s\)/],
  ])('rejects %j with a sentence naming the option', (sources, message) => {
    expect(() => resolveOptions(sources)).toThrow(message);
  });

  it('rejects unknown keys in the config file', () => {
    const file = path.join(t.dir, 'bad.yaml');
    writeFileSync(file, 'apiPrt: 1\n');
    expect(() => resolveOptions({ configFile: file })).toThrow(/unknown option "apiPrt"/);
  });

  it('documents every option with its flag, env name and default in docs/configuration.md', () => {
    const doc = readFileSync('docs/configuration.md', 'utf8');
    for (const [name, spec] of Object.entries(OPTION_SPECS)) {
      const row = doc.split('\n').find((l) => l.startsWith(`| \`--${kebab(name)}\` |`));
      expect(row, name).toBeDefined();
      expect(row).toContain(`\`${envName(name)}\``);
      if (spec.default !== undefined && spec.default !== '') expect(row).toContain(`\`${String(spec.default)}\``);
    }
  });
});
