// The system Nginx's main conf on a gateway host: our includes, server_names_hash_bucket_size
// and worker_rlimit_nofile, written only after `nginx -t` passed on the patched text.

export interface NginxConfOptions {
  /** The main conf, e.g. /etc/nginx/nginx.conf. */
  nginxConf: string;
  /** The gateway's --sites-dir: `<dir>/*.conf` and `<dir>/sites/*.conf` get included in http {}. */
  sitesDir: string;
  /** argv that tests a main conf; `-c <file>` is appended (the gateway's --test-command). */
  testCommand: string[];
}

export interface NginxConfOutcome {
  changed: boolean;
  /** One line per edit made, for the install's report. */
  edits: string[];
}

/** Placeholder until the patcher lands: refuses, so nothing is half-done. */
export function ensureNginxConf(options: NginxConfOptions): Promise<NginxConfOutcome> {
  return Promise.reject(new Error(`patching ${options.nginxConf} is not built yet`));
}
