// The private Nginx's main conf: the text (pure) and writing it with the directories it names.

import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ProxyError } from '../../errors.js';
import { GLOBAL_FILE, SITES_SUBDIR, quote } from './names.js';

export const DEFAULT_WORKER_USER = 'www-data';

export interface MainConfOptions {
  /** The managed conf dir (global file + sites/). Default <dir>/conf.d. */
  confDir?: string;
  workerProcesses?: number | 'auto';
  workerConnections?: number;
  /**
   * The user the workers run as: they face the internet, so when the master runs as root it is
   * DEFAULT_WORKER_USER unless told otherwise; not root, no `user` line (Nginx could not switch).
   * The workers then reach by path only what the gateway gives that user: see src/gateway/nginx-worker.ts.
   */
  user?: string | null;
  /** Where client_body_temp and the other temp dirs go (the workers write there). Default <dir>/tmp. */
  tempDir?: string;
  /** Must be notice or more verbose: NginxProcess.reload() reads the reload outcome from it. */
  errorLogLevel?: 'debug' | 'info' | 'notice';
  /** Set server_names_hash_* here (1,000s of sites). Default true. */
  serverNamesHash?: boolean;
  /** How long old workers may keep serving long requests after a reload; null = forever. */
  workerShutdownTimeoutSec?: number | null;
  /** Unix sockets the sites listen on: removed before each start (Nginx does not unlink before bind). */
  unixListeners?: string[];
}

export interface NginxPaths {
  prefix: string;
  confPath: string;
  confDir: string;
  pidPath: string;
  errorLogPath: string;
  tempDir: string;
  /** MainConfOptions.unixListeners. */
  unixListeners?: string[];
}

const TEMP_KINDS = ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'] as const;

/** The main nginx.conf text for a private Nginx under `dir` (no root-owned paths). */
export function mainConfText(dir: string, opts: MainConfOptions = {}): { text: string; paths: NginxPaths } {
  const prefix = resolve(dir);
  const confDir = resolve(opts.confDir ?? join(prefix, 'conf.d'));
  const tempDir = resolve(opts.tempDir ?? join(prefix, 'tmp'));
  const paths: NginxPaths = {
    prefix,
    confPath: join(prefix, 'nginx.conf'),
    confDir,
    pidPath: join(prefix, 'nginx.pid'),
    errorLogPath: join(prefix, 'logs', 'error.log'),
    tempDir,
    ...(opts.unixListeners ? { unixListeners: opts.unixListeners } : {}),
  };
  const user = opts.user === undefined ? (process.getuid?.() === 0 ? DEFAULT_WORKER_USER : null) : opts.user;
  const workers = opts.workerProcesses ?? 1;
  if (workers !== 'auto' && (!Number.isInteger(workers) || workers < 1)) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `workerProcesses must be a positive integer or "auto"`);
  }
  const tmp = (k: string) => quote(join(tempDir, k));
  const l = [
    '# main conf of the private Nginx run by dstack-proxy; rewritten at every start',
    `worker_processes ${workers};`,
    `pid ${quote(paths.pidPath)};`,
    `error_log ${quote(paths.errorLogPath)} ${opts.errorLogLevel ?? 'notice'};`,
  ];
  if (user) l.push(`user ${quote(user)};`);
  if (opts.workerShutdownTimeoutSec != null) l.push(`worker_shutdown_timeout ${opts.workerShutdownTimeoutSec}s;`);
  // Services share one keep-alive pool to the data plane (render.ts DATAPLANE_KEEPALIVE idle
  // connections at most), so this need not grow with the number of services.
  l.push(`events { worker_connections ${opts.workerConnections ?? 4096}; }`, 'http {');
  l.push(
    `    client_body_temp_path ${tmp('body')};`,
    `    proxy_temp_path ${tmp('proxy')};`,
    `    fastcgi_temp_path ${tmp('fastcgi')};`,
    `    uwsgi_temp_path ${tmp('uwsgi')};`,
    `    scgi_temp_path ${tmp('scgi')};`,
    '    access_log off;',
    '    server_tokens off;',
    '    sendfile on;',
    '    tcp_nodelay on;',
  );
  if (opts.serverNamesHash ?? true) {
    l.push('    server_names_hash_bucket_size 128;', '    server_names_hash_max_size 65536;');
  }
  // The global file first (log_format must precede the access_log lines that use it).
  l.push(`    include ${quote(join(confDir, '*.conf'))};`, `    include ${quote(join(confDir, SITES_SUBDIR, '*.conf'))};`, '}');
  return { text: `${l.join('\n')}\n`, paths };
}

/** Write nginx.conf and create the directories a private Nginx needs. */
export async function writeMainConf(dir: string, opts: MainConfOptions = {}): Promise<NginxPaths> {
  const { text, paths } = mainConfText(dir, opts);
  await mkdir(join(paths.prefix, 'logs'), { recursive: true });
  // Nginx's master makes the temp dirs its workers' own at start (when it switches users).
  for (const k of TEMP_KINDS) await mkdir(join(paths.tempDir, k), { recursive: true, mode: 0o700 });
  await mkdir(join(paths.confDir, SITES_SUBDIR), { recursive: true });
  await writeFile(paths.confPath, text, { mode: 0o644 });
  return paths;
}

export { GLOBAL_FILE };
