// The options an adopted gateway host needs, checked at the door: the access log's path goes
// into every site's access_log directive, --default-server false leaves no default server for
// --health-check-ok to answer on.

import { describe, expect, it } from 'vitest';
import { ProxyError } from '../../src/errors.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { accessLogPath } from '../../src/gateway/nginx-host.js';

function refusal(flags: Record<string, string>): ProxyError {
  try {
    resolveOptions({ flags });
  } catch (err) {
    return err as ProxyError;
  }
  throw new Error(`accepted ${JSON.stringify(flags)}`);
}

describe('adopted-host options', () => {
  it('default to what a gateway of its own does', () => {
    const o = resolveOptions({ flags: { stateDir: '/srv/gw' } });
    expect(o).toMatchObject({ accessLog: undefined, certbotConfigDir: undefined, defaultServer: 'true' });
    expect(accessLogPath(o)).toBe('/srv/gw/logs/access.log');
  });

  it('take the paths of a host that dstack provisioned', () => {
    const o = resolveOptions({
      env: { DSTACK_PROXY_ACCESS_LOG: '/var/log/nginx/dstack.access.log' },
      flags: { certbotConfigDir: '/etc/letsencrypt', defaultServer: 'false' },
    });
    expect(o).toMatchObject({ certbotConfigDir: '/etc/letsencrypt', defaultServer: 'false' });
    expect(accessLogPath(o)).toBe('/var/log/nginx/dstack.access.log');
  });

  it.each([
    ['logs/access.log', /--access-log must be the absolute path of a file, got "logs\/access.log"/],
    ['/var/log/nginx/', /--access-log must be the absolute path of a file/],
    ['/var/log/$host.log', /--access-log "\/var\/log\/\$host.log" cannot be written into the Nginx sites: "\$" cannot be written/],
    ['/var/log/a\nb.log', /--access-log .* cannot be written into the Nginx sites: control character/],
  ])('refuse --access-log %j with a sentence saying why', (path, message) => {
    const err = refusal({ accessLog: path });
    expect(err).toBeInstanceOf(ProxyError);
    expect(err.code).toBe('DP_ERR_BAD_OPTION');
    expect(err.message).toMatch(message);
  });

  it('accept quotes and spaces in --access-log (written as a quoted Nginx string)', () => {
    expect(resolveOptions({ flags: { accessLog: "/var/log/my logs/it's.log" } }).accessLog).toBe("/var/log/my logs/it's.log");
  });

  it('refuse --default-server false with --health-check-ok true', () => {
    const err = refusal({ defaultServer: 'false', healthCheckOk: 'true' });
    expect(err.code).toBe('DP_ERR_BAD_OPTION');
    expect(err.message).toMatch(/--health-check-ok true answers on our default server, and --default-server false renders none/);
    expect(refusal({ defaultServer: 'no' }).message).toMatch(/--default-server: must be one of true, false/);
  });
});
