// `dstack-proxy host adopt`: take over a gateway host dstack provisioned. See src/host/adopt.ts.

import { parseArgs } from 'node:util';
import {
  ADOPTED_SITES_DIR,
  DEFAULT_ACCESS_LOG,
  DEFAULT_DSTACK_HOME,
  DEFAULT_LETSENCRYPT,
  DEFAULT_NGINX_CONF,
  DEFAULT_SITES_ENABLED,
  adoptHost,
} from '../host/adopt.js';
import { DEFAULT_ROOT } from '../host/layout.js';
import type { Command } from './command.js';
import { UsageError } from './command.js';

const DEFAULT_UNIT_DIR = '/etc/systemd/system';

export const hostAdoptCommand: Command = {
  name: 'adopt',
  summary: 'take over a gateway host dstack provisioned (its Nginx, certificates, unit name and update.sh)',
  help: `Usage: dstack-proxy host adopt [options]

Take over a gateway host that dstack provisioned (Ubuntu, the system Nginx, ~/dstack), step by
step, printing each; a second run changes nothing. Nothing is deleted: what adopt takes away
is moved under <root>/adopted/<time>/ at its original path (listed in moved.txt).

  a. stop and disable dstack's unit dstack.gateway
  b. move dstack's files out of sites-enabled (00-log-format.conf, 443-*.conf, router-workers.*.conf)
  c. write <root>/config.yaml (system Nginx, dstack's API port and server sockets, its access log
     and letsencrypt dir) unless one exists
  d. add our includes and limits to nginx.conf (tested with nginx -t first), reload Nginx
  e. replace ~/dstack/update.sh with one that runs our update (dstack's arguments are ignored)
  f. install our unit under the name dstack.gateway, so dstack's server restarts us
  g. keep the certificates; disable certbot's own renewal timer (we renew)
  h. no state is carried over: dstack's server registers everything again

Options:
  --root DIR             our root (default: ${DEFAULT_ROOT})
  --dstack-home DIR      dstack's gateway home (default: ${DEFAULT_DSTACK_HOME})
  --nginx-conf FILE      the system Nginx's main conf (default: ${DEFAULT_NGINX_CONF})
  --sites-enabled DIR    where dstack wrote its sites (default: ${DEFAULT_SITES_ENABLED})
  --sites-dir DIR        where our sites go (default: ${ADOPTED_SITES_DIR})
  --default-site keep|remove
                         keep: the distribution's default site keeps answering unknown hosts
                         (load balancer health checks) and we render no default_server;
                         remove: it is moved away and ours answers (default: keep)
  --letsencrypt DIR      certbot's config dir with dstack's certificates (default: ${DEFAULT_LETSENCRYPT})
  --access-log FILE      the sites' access log (default: ${DEFAULT_ACCESS_LOG})
  --systemctl "ARGV"     the systemctl program and its flags, split on spaces (default: systemctl)
  --unit-dir DIR         where unit files live (default: ${DEFAULT_UNIT_DIR})
  --nginx-bin PROGRAM    nginx, for -t and -s reload (default: nginx)
  --set KEY=VALUE        an extra config.yaml key when adopt writes it (repeatable)
  --dry-run              print the steps, change nothing

For the unit step (f), the slot our package is installed in, as host install takes them:
  --slot blue|green      default: the active slot (<root>/version)
  --package SPEC         default: what its slot.json records
  --runtime VERSION      default: what its slot.json records
  --runtime-from URL     recorded in host.json for updates
  --ready-timeout SECONDS  how long to wait for /readyz (default: 60)

Exit codes: 0 adopted (or already); 1 failed, or a step could not be done (named on stderr).`,
  async run(argv, io) {
    const { values } = parseArgs({
      args: argv,
      options: {
        root: { type: 'string' },
        'dstack-home': { type: 'string' },
        'nginx-conf': { type: 'string' },
        'sites-enabled': { type: 'string' },
        'sites-dir': { type: 'string' },
        'default-site': { type: 'string' },
        letsencrypt: { type: 'string' },
        'access-log': { type: 'string' },
        systemctl: { type: 'string' },
        'unit-dir': { type: 'string' },
        'nginx-bin': { type: 'string' },
        set: { type: 'string', multiple: true },
        'dry-run': { type: 'boolean' },
        slot: { type: 'string' },
        package: { type: 'string' },
        runtime: { type: 'string' },
        'runtime-from': { type: 'string' },
        'ready-timeout': { type: 'string' },
      },
      strict: true,
    });
    const defaultSite = values['default-site'] ?? 'keep';
    if (defaultSite !== 'keep' && defaultSite !== 'remove')
      throw new UsageError(`--default-site must be keep or remove; got ${JSON.stringify(defaultSite)}`);
    const extraConfig: Record<string, string> = {};
    for (const kv of values.set ?? []) {
      const m = /^([A-Za-z][A-Za-z0-9]*)=(.*)$/s.exec(kv);
      if (!m) throw new UsageError(`--set must be KEY=VALUE with a camelCase config key; got ${JSON.stringify(kv)}`);
      extraConfig[m[1]!] = m[2]!;
    }
    const slot = values.slot;
    if (slot !== undefined && slot !== 'blue' && slot !== 'green') throw new UsageError('--slot must be blue or green');
    const timeout = Number(values['ready-timeout'] ?? '60');
    if (!Number.isFinite(timeout) || timeout <= 0) throw new UsageError('--ready-timeout must be a positive number of seconds');
    const systemctlArgv = (values.systemctl ?? 'systemctl').split(' ').filter(Boolean);
    try {
      const result = await adoptHost(
        {
          root: values.root ?? DEFAULT_ROOT,
          dstackHome: values['dstack-home'] ?? DEFAULT_DSTACK_HOME,
          nginxConf: values['nginx-conf'] ?? DEFAULT_NGINX_CONF,
          sitesEnabled: values['sites-enabled'] ?? DEFAULT_SITES_ENABLED,
          sitesDir: values['sites-dir'] ?? ADOPTED_SITES_DIR,
          defaultSite,
          letsencrypt: values.letsencrypt ?? DEFAULT_LETSENCRYPT,
          accessLog: values['access-log'] ?? DEFAULT_ACCESS_LOG,
          systemctl: systemctlArgv,
          unitDir: values['unit-dir'] ?? DEFAULT_UNIT_DIR,
          nginxBin: values['nginx-bin'] ?? 'nginx',
          snapBin: 'snap',
          extraConfig,
          dryRun: values['dry-run'] ?? false,
          install: {
            ...(slot ? { slot } : {}),
            ...(values.package ? { package: values.package } : {}),
            ...(values.runtime ? { runtime: values.runtime } : {}),
            ...(values['runtime-from'] ? { runtimeFrom: values['runtime-from'] } : {}),
            readyTimeoutMs: timeout * 1000,
          },
        },
        (line) => io.stdout(`${line}\n`),
      );
      for (const m of result.missing) io.stderr(`dstack-proxy host adopt: not done: ${m}\n`);
      return result.missing.length > 0 ? 1 : 0;
    } catch (err) {
      io.stderr(`dstack-proxy host adopt: ${(err as Error).message}\n`);
      return 1;
    }
  },
};
