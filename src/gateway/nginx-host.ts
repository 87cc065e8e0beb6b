// What the gateway prepares on the host before its loops exist: the dirs Nginx's workers open,
// the access log's dir, the internal listener the model API reaches Nginx on, certbot's leftovers, and
// either a private Nginx master under the state dir or the system one's commands.

import { mkdir } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { Logger } from 'pino';
import { removeEabLeftovers } from '../reconcilers/tls/certbot.js';
import { NginxProcess, systemNginx, testConfig, writeMainConf } from '../reconcilers/nginx/nginx-process.js';
import type { NginxLoopOptions } from '../reconcilers/nginx/loop.js';
import { prepareInternalListener, removeStaleSocket, type InternalListener } from './internal-listener.js';
import { SOCKETS_SUBDIR, lookupUser, prepareWorkerDirs, type WorkerDirs } from './nginx-worker.js';
import type { GatewayOptions } from './options.js';

export interface CertbotDirs {
  configDir: string;
  workDir: string;
  logsDir: string;
}

export interface GatewayHost {
  stateDir: string;
  workerDirs: WorkerDirs;
  accessLog: string;
  internal: InternalListener;
  certbotDirs: CertbotDirs;
  /** The private Nginx, when it runs one (not started yet). */
  nginx: NginxProcess | undefined;
  confDir: string;
  mainConfPath: string;
  test: NginxLoopOptions['test'];
  reload: NginxLoopOptions['reload'];
}

/**
 * Nginx's workers run as --nginx-user and reach only the worker dir (balancer sockets, ACME
 * webroot, temp files); a private Nginx started without root runs them as our own user.
 * `onMasterEvent` is told when a private master died or came back, so a pass reports it and
 * re-applies what a failed reload rolled back.
 */
/** The dir the Nginx workers may open (sockets, ACME webroot, temp files). */
export function workerDirOf(options: Pick<GatewayOptions, 'stateDir' | 'nginxWorkerDir'>): string {
  return options.nginxWorkerDir ? resolve(options.nginxWorkerDir) : `${resolve(options.stateDir)}-nginx`;
}

/** The data-plane sockets' dir, under the worker dir. */
export function socketDirOf(options: Pick<GatewayOptions, 'stateDir' | 'nginxWorkerDir'>): string {
  return join(workerDirOf(options), SOCKETS_SUBDIR);
}

export async function prepareGatewayHost(options: GatewayOptions, logger: Logger, onMasterEvent: () => void): Promise<GatewayHost> {
  const stateDir = resolve(options.stateDir);
  const switchesUser = options.nginx === 'system' || process.getuid?.() === 0;
  const worker = switchesUser ? await lookupUser(options.nginxUser) : null;
  const workerDirs = await prepareWorkerDirs(workerDirOf(options), worker, logger);
  // An adopted host points this where the system's logrotate already rotates; its dir may
  // be the system Nginx's own (it exists), or a fresh one of ours.
  const accessLog = accessLogPath(options);
  await mkdir(dirname(accessLog), { recursive: true });
  // The model API's way into Nginx: a Unix socket only the gateway's user can reach.
  const internal = await prepareInternalListener(stateDir);
  // certbot's EAB config files (the HMAC key) that a crash during a run left behind.
  const certbotDirs = certbotDirsUnder(options.certbotDir ? resolve(options.certbotDir) : join(stateDir, 'certbot'));
  // Only the config dir is shared with a certbot that ran before us (/etc/letsencrypt: its
  // accounts and lineages); its work and logs dirs stay ours. The TLS loop serves any valid
  // lineage it finds there, whoever obtained it, and renews it in place (--cert-name <domain>).
  if (options.certbotConfigDir) certbotDirs.configDir = resolve(options.certbotConfigDir);
  await removeEabLeftovers(certbotDirs.workDir);
  const common = { stateDir, workerDirs, accessLog, internal, certbotDirs };

  if (options.nginx === 'private') {
    const paths = await writeMainConf(join(stateDir, 'nginx'), {
      ...(options.sitesDir ? { confDir: resolve(options.sitesDir) } : {}),
      user: worker?.user ?? null,
      tempDir: workerDirs.tempDir,
      unixListeners: [internal.socketPath],
    });
    const nginx: NginxProcess = new NginxProcess({
      paths,
      nginxBin: options.nginxBin,
      logger: logger.child({ component: 'nginx' }),
      onEvent: (e) => {
        if ((e.type === 'exited' && !e.expected) || e.type === 'restart-failed' || (e.type === 'started' && nginx.info.lastExit))
          onMasterEvent();
      },
    });
    return {
      ...common,
      nginx,
      confDir: paths.confDir,
      mainConfPath: paths.confPath,
      test: (conf) => testConfig(conf, paths.prefix, { nginxBin: options.nginxBin }),
      reload: (hint) => nginx.reload(hint),
    };
  }
  const confDir = resolve(options.sitesDir!);
  await mkdir(join(confDir, 'sites'), { recursive: true });
  const mainConfPath = resolve(options.nginxConf);
  const system = systemNginx({ reloadCommand: options.reloadCommand, testCommand: options.testCommand, nginxConf: mainConfPath });
  // A file left by a system Nginx that died would make its next reload fail.
  await removeStaleSocket(internal.socketPath);
  return { ...common, nginx: undefined, confDir, mainConfPath, test: (conf) => system.test(conf), reload: (hint) => system.reload(hint) };
}

/** The access log the sites write and the stats collector follows. */
export function accessLogPath(options: Pick<GatewayOptions, 'stateDir' | 'accessLog'>): string {
  return options.accessLog ? resolve(options.accessLog) : join(resolve(options.stateDir), 'logs', 'access.log');
}

function certbotDirsUnder(dir: string): CertbotDirs {
  return { configDir: join(dir, 'config'), workDir: join(dir, 'work'), logsDir: join(dir, 'logs') };
}
