// A fake gateway host as dstack provisions it (Ubuntu, the system Nginx, ~/dstack with blue and
// green venvs), built in a temporary directory: the stock confs and dstack's own files, with
// every path rewritten into that directory.

import { execa } from 'execa';
import { chmodSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { freePorts } from '../helpers/ports.js';
import { systemctlReplacement } from './fixtures.js';

/** /etc/nginx/nginx.conf of Debian 12's nginx-common 1.22.1 (error_log in the main context). */
export const DEBIAN_12_NGINX_CONF = `user www-data;
worker_processes auto;
pid /run/nginx.pid;
error_log /var/log/nginx/error.log;
include /etc/nginx/modules-enabled/*.conf;

events {
	worker_connections 768;
	# multi_accept on;
}

http {

	##
	# Basic Settings
	##

	sendfile on;
	tcp_nopush on;
	types_hash_max_size 2048;
	# server_tokens off;

	# server_names_hash_bucket_size 64;
	# server_name_in_redirect off;

	include /etc/nginx/mime.types;
	default_type application/octet-stream;

	##
	# SSL Settings
	##

	ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3; # Dropping SSLv3, ref: POODLE
	ssl_prefer_server_ciphers on;

	##
	# Logging Settings
	##

	access_log /var/log/nginx/access.log;

	##
	# Gzip Settings
	##

	gzip on;

	# gzip_vary on;
	# gzip_proxied any;
	# gzip_comp_level 6;
	# gzip_buffers 16 8k;
	# gzip_http_version 1.1;
	# gzip_types text/plain text/css application/json application/javascript text/xml application/xml application/xml+rss text/javascript;

	##
	# Virtual Host Configs
	##

	include /etc/nginx/conf.d/*.conf;
	include /etc/nginx/sites-enabled/*;
}


#mail {
#	# See sample authentication script at:
#	# http://wiki.nginx.org/ImapAuthenticateWithApachePhpScript
#
#	# auth_http localhost/auth.php;
#	# pop3_capabilities "TOP" "USER";
#	# imap_capabilities "IMAP4rev1" "UIDPLUS";
#
#	server {
#		listen     localhost:110;
#		protocol   pop3;
#		proxy      on;
#	}
#
#	server {
#		listen     localhost:143;
#		protocol   imap;
#		proxy      on;
#	}
#}
`;

/** /etc/nginx/nginx.conf of Ubuntu 22.04's nginx-common 1.18.0 (error_log inside http). */
export const UBUNTU_2204_NGINX_CONF = `user www-data;
worker_processes auto;
pid /run/nginx.pid;
include /etc/nginx/modules-enabled/*.conf;

events {
	worker_connections 768;
	# multi_accept on;
}

http {

	##
	# Basic Settings
	##

	sendfile on;
	tcp_nopush on;
	types_hash_max_size 2048;
	# server_tokens off;

	# server_names_hash_bucket_size 64;
	# server_name_in_redirect off;

	include /etc/nginx/mime.types;
	default_type application/octet-stream;

	##
	# SSL Settings
	##

	ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3; # Dropping SSLv3, ref: POODLE
	ssl_prefer_server_ciphers on;

	##
	# Logging Settings
	##

	access_log /var/log/nginx/access.log;
	error_log /var/log/nginx/error.log;

	##
	# Gzip Settings
	##

	gzip on;

	# gzip_vary on;
	# gzip_proxied any;
	# gzip_comp_level 6;
	# gzip_buffers 16 8k;
	# gzip_http_version 1.1;
	# gzip_types text/plain text/css application/json application/javascript text/xml application/xml application/xml+rss text/javascript;

	##
	# Virtual Host Configs
	##

	include /etc/nginx/conf.d/*.conf;
	include /etc/nginx/sites-enabled/*;
}


#mail {
#	# See sample authentication script at:
#	# http://wiki.nginx.org/ImapAuthenticateWithApachePhpScript
#
#	# auth_http localhost/auth.php;
#	# pop3_capabilities "TOP" "USER";
#	# imap_capabilities "IMAP4rev1" "UIDPLUS";
#
#	server {
#		listen     localhost:110;
#		protocol   pop3;
#		proxy      on;
#	}
#
#	server {
#		listen     localhost:143;
#		protocol   imap;
#		proxy      on;
#	}
#}
`;

// ---- dstack's own files, as its gateway package and app write them ----------------------------

/** resources/nginx/00-log-format.conf of dstack's gateway (written by the app into sites-enabled). */
export const DSTACK_LOG_FORMAT_CONF = "log_format dstack_stat '$time_iso8601 $host $status $request_time';\n";

/** resources/systemd/update.sh of the dstack-gateway package (the snapshot the server drives). */
export const DSTACK_UPDATE_SH = `#!/bin/sh
set -e
root="$( cd -- "$(dirname "$0")" >/dev/null 2>&1; pwd -P )"

# usage: ./update.sh <wheel_url> <build>
if [ "$#" -eq 0 ]; then
    echo "Error: Missing wheel URL"
    exit 1
elif [ "$#" -eq 1 ]; then
    echo "Error: Missing build version"
    exit 1
fi

if [ -f "$root/version" ]; then
  version=$(cat "$root/version")  # blue/green
else
  version="blue"
fi

# check the current build version
current_build=$($root/$version/bin/pip show dstack-gateway | grep Version | awk '{print $2}')
if [ "$current_build" = "$2" ]; then
  echo "The build $2 is already installed. Skipping..."
  exit 0
fi

# flip the version
if [ "$version" = "blue" ]; then
  version="green"
else
  version="blue"
fi

"$root/$version/bin/pip" uninstall -y dstack-gateway dstack
"$root/$version/bin/pip" cache remove dstack
"$root/$version/bin/pip" install "$1"
sudo "$root/$version/bin/python" -m dstack.gateway.systemd install
echo "$version" > "$root/version"
sudo systemctl daemon-reload
sudo systemctl restart dstack.gateway

echo "Update successfully completed"
`;

/** systemd/resources/start.sh of the dstack-gateway package. */
export const DSTACK_START_SH = `#!/bin/sh
set -e
root="$( cd -- "$(dirname "$0")" >/dev/null 2>&1; pwd -P )"

if [ -f "$root/version" ]; then
  version=$(cat "$root/version")  # blue/green
else
  version="blue"
  echo "$version" > "$root/version"
fi
"$root/$version/bin/uvicorn" dstack.gateway.main:app
`;

/**
 * resources/systemd/dstack.gateway.service with {working_dir} filled in. The fake drops
 * `User=ubuntu` / `Group=ubuntu` (the test machine has no such user); everything else is dstack's.
 */
export function dstackUnit(workingDir: string): string {
  return `[Unit]
Description=dstack gateway service
After=network.target

[Service]
ExecStart=/bin/sh ${workingDir}/start.sh
WorkingDirectory=${workingDir}
Restart=always
RestartSec=5

[Install]
WantedBy=default.target
`;
}

/**
 * resources/nginx/service.jinja2 of dstack's gateway rendered for one https service with one
 * replica and auth, as `443-<domain>.conf`; the listen ports and paths rewritten into the fake.
 */
export function dstackServiceConf(p: {
  domain: string;
  replicaSocket: string;
  accessLog: string;
  letsencrypt: string;
  httpPort: number;
  httpsPort: number;
}): string {
  return `

upstream ${p.domain}.upstream {
    server unix:${p.replicaSocket};  # replica 0b3a3f8e-6a26-4c3b-9d56-2c1f2f3f9a11
}

server {
    server_name ${p.domain};
    limit_req_status 429;
    set $dstack_replica_hit 0;
    access_log ${p.accessLog} dstack_stat;
    client_max_body_size 67108864;

    location / {
        auth_request /_dstack_auth;

        try_files /nonexistent @$http_upgrade;

    }

    location @websocket {
        set $dstack_replica_hit 1;
        proxy_pass http://${p.domain}.upstream;
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header Host $host;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection "Upgrade";
        proxy_read_timeout 300s;
    }
    location @ {
        set $dstack_replica_hit 1;
        proxy_pass http://${p.domain}.upstream;
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header Host $host;
        proxy_read_timeout 300s;
    }

    location = /_dstack_auth {
        internal;
        if ($remote_addr = 127.0.0.1) {
            # for requests from the gateway app, e.g. from the OpenAI-compatible API
            return 200;
        }
        proxy_pass http://localhost:8000/api/auth/main;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header X-Original-URI $request_uri;
        proxy_set_header Authorization $http_authorization;
    }

    listen 127.0.0.1:${p.httpPort};
    listen 127.0.0.1:${p.httpsPort} ssl;
    ssl_certificate ${p.letsencrypt}/live/${p.domain}/fullchain.pem;
    ssl_certificate_key ${p.letsencrypt}/live/${p.domain}/privkey.pem;
    include ${p.letsencrypt}/options-ssl-nginx.conf;
    ssl_dhparam ${p.letsencrypt}/ssl-dhparams.pem;
    set $force_https 1;
    if ($scheme = "https") {
        set $force_https 0;
    }
    if ($remote_addr = 127.0.0.1) {
        set $force_https 0;
    }
    if ($force_https) {
        return 301 https://$host$request_uri;
    }
}
`;
}

/** certbot-nginx's options-ssl-nginx.conf, which dstack's sites include. */
export const CERTBOT_OPTIONS_SSL_NGINX = `# This file contains important security parameters. If you modify this file
# manually, Certbot will be unable to automatically provide future security
# updates. Instead, Certbot will print and log an error message with a path to
# the up-to-date file that you will need to refer to when manually updating
# this file. Contents are based on https://ssl-config.mozilla.org

ssl_session_cache shared:le_nginx_SSL:10m;
ssl_session_timeout 1440m;
ssl_session_tickets off;

ssl_protocols TLSv1.2 TLSv1.3;
ssl_prefer_server_ciphers off;

ssl_ciphers "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";
`;

/** Ubuntu's sites-available/default (its comments shortened), on a loopback port. */
export function ubuntuDefaultSite(p: { port: number; webRoot: string }): string {
  return `##
# You should look at the following URL's in order to grasp a solid understanding
# of Nginx configuration files in order to fully unleash the power of Nginx.
# https://www.nginx.com/resources/wiki/start/
##

# Default server configuration
#
server {
	listen 127.0.0.1:${p.port} default_server;

	root ${p.webRoot};

	# Add index.php to the list if you are using PHP
	index index.html index.htm index.nginx-debian.html;

	server_name _;

	location / {
		# First attempt to serve request as file, then
		# as directory, then fall back to displaying a 404.
		try_files $uri $uri/ =404;
	}
}
`;
}

// ---- the fake host --------------------------------------------------------------------------

export interface DstackLayout {
  /** The temp dir everything is under. */
  dir: string;
  /** Our root (not created). */
  root: string;
  dstackHome: string;
  nginxConf: string;
  sitesEnabled: string;
  sitesDir: string;
  letsencrypt: string;
  accessLog: string;
  domain: string;
  /** The default site's port (Ubuntu's `listen 80 default_server`). */
  defaultPort: number;
  httpPort: number;
  httpsPort: number;
  /** The daemonless systemctl on <dir>/sysroot, and its unit dir. */
  systemctl: string[];
  unitDir: string;
  /** The fake dstack app's pid file (its fake uvicorn writes it). */
  appPidFile: string;
  /** Starts the "system" Nginx on the fake conf (daemonized, as the distribution's unit would). */
  startNginx(): Promise<void>;
  /** `nginx -c <conf> -s reload`. */
  reloadNginx(): Promise<void>;
  nginxPid(): Promise<number | undefined>;
  /** Stops everything started here and removes the dir. */
  cleanup(): Promise<void>;
}

function mkFile(path: string, text: string, mode = 0o644): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text, { mode });
  chmodSync(path, mode);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Builds the fake host. dstack's unit is installed, enabled and started in the daemonless
 * systemctl (its uvicorn is a stand-in that sleeps); the system Nginx is not started yet.
 */
export async function makeDstackLayout(opts: { domain?: string } = {}): Promise<DstackLayout> {
  const dir = await mkdtemp(join(tmpdir(), 'dp-dstack-host-'));
  try {
    return await build(dir, opts);
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
}

async function build(dir: string, opts: { domain?: string }): Promise<DstackLayout> {
  // The system Nginx's workers (www-data) read the web root under it, as under /var/www.
  chmodSync(dir, 0o755);
  const [defaultPort, httpPort, httpsPort] = await freePorts(3);
  const domain = opts.domain ?? 'svc-1.gw.example.test';
  const etcNginx = join(dir, 'etc', 'nginx');
  const nginxConf = join(etcNginx, 'nginx.conf');
  const sitesEnabled = join(etcNginx, 'sites-enabled');
  const letsencrypt = join(dir, 'etc', 'letsencrypt');
  const logDir = join(dir, 'var', 'log', 'nginx');
  const accessLog = join(logDir, 'dstack.access.log');
  const dstackHome = join(dir, 'home', 'ubuntu', 'dstack');
  const pidFile = join(dir, 'run', 'nginx.pid');
  const appPidFile = join(dir, 'run', 'dstack-app.pid');

  // ~/dstack: two venvs (only what start.sh and update.sh touch), the version, the scripts.
  for (const colour of ['blue', 'green']) {
    mkFile(
      join(dstackHome, colour, 'bin', 'uvicorn'),
      `#!/bin/sh\n# stands in for dstack's app\necho $$ > ${appPidFile}\nexec sleep 3600\n`,
      0o755,
    );
    mkFile(join(dstackHome, colour, 'bin', 'pip'), '#!/bin/sh\necho "Name: dstack-gateway"\necho "Version: 0.19.1"\n', 0o755);
  }
  mkFile(join(dstackHome, 'version'), 'blue\n');
  mkFile(join(dstackHome, 'update.sh'), DSTACK_UPDATE_SH);
  mkFile(join(dstackHome, 'start.sh'), DSTACK_START_SH);
  mkdirSync(join(dstackHome, 'server-connections'), { recursive: true });

  // The system Nginx: Ubuntu's stock conf with its paths moved into the dir; the temp paths
  // Debian compiles in (/var/lib/nginx) are set explicitly so nothing outside is written.
  const varLib = join(dir, 'var', 'lib', 'nginx');
  for (const k of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(varLib, k), { recursive: true });
  mkdirSync(logDir, { recursive: true });
  mkdirSync(join(dir, 'run'), { recursive: true });
  mkdirSync(join(etcNginx, 'modules-enabled'), { recursive: true });
  mkdirSync(join(etcNginx, 'conf.d'), { recursive: true });
  mkFile(join(etcNginx, 'mime.types'), 'types {\n    text/html html htm shtml;\n    application/json json;\n}\n');
  const temps = ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']
    .map((k) => `\t${k === 'body' ? 'client_body' : k}_temp_path ${join(varLib, k)};\n`)
    .join('');
  const conf = UBUNTU_2204_NGINX_CONF.replaceAll('/etc/nginx/', `${etcNginx}/`)
    .replaceAll('/var/log/nginx/', `${logDir}/`)
    .replace('pid /run/nginx.pid;', `pid ${pidFile};\nerror_log ${join(logDir, 'error.log')};`)
    .replace('\tinclude /', `${temps}\tinclude /`);
  mkFile(nginxConf, conf);
  const webRoot = join(dir, 'var', 'www', 'html');
  mkFile(
    join(webRoot, 'index.nginx-debian.html'),
    '<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n<body>\n<h1>Welcome to nginx!</h1>\n</body>\n</html>\n',
  );
  mkFile(join(etcNginx, 'sites-available', 'default'), ubuntuDefaultSite({ port: defaultPort!, webRoot }));
  mkdirSync(sitesEnabled, { recursive: true });
  symlinkSync(join(etcNginx, 'sites-available', 'default'), join(sitesEnabled, 'default'));
  // dstack's app writes its files with `sudo cp -p` from a temp file: mode 0600.
  mkFile(join(sitesEnabled, '00-log-format.conf'), DSTACK_LOG_FORMAT_CONF, 0o600);
  mkFile(
    join(sitesEnabled, `443-${domain}.conf`),
    dstackServiceConf({
      domain,
      replicaSocket: join(dir, 'tmp', 'tmpabc123', 'replica.sock'),
      accessLog,
      letsencrypt,
      httpPort: httpPort!,
      httpsPort: httpsPort!,
    }),
    0o600,
  );

  // A certbot lineage: live/ links into archive/, as certbot keeps them.
  const archive = join(letsencrypt, 'archive', domain);
  mkdirSync(archive, { recursive: true });
  await execa('openssl', [
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '60',
    '-subj',
    `/CN=${domain}`,
    '-addext',
    `subjectAltName=DNS:${domain}`,
    '-keyout',
    join(archive, 'privkey1.pem'),
    '-out',
    join(archive, 'cert1.pem'),
  ]);
  writeFileSync(join(archive, 'chain1.pem'), '');
  writeFileSync(join(archive, 'fullchain1.pem'), readFileSync(join(archive, 'cert1.pem')));
  const live = join(letsencrypt, 'live', domain);
  mkdirSync(live, { recursive: true });
  for (const f of ['cert', 'chain', 'fullchain', 'privkey']) symlinkSync(`../../archive/${domain}/${f}1.pem`, join(live, `${f}.pem`));
  mkFile(
    join(letsencrypt, 'renewal', `${domain}.conf`),
    `# renew_before_expiry = 30 days\nversion = 2.11.0\narchive_dir = ${archive}\ncert = ${live}/cert.pem\nprivkey = ${live}/privkey.pem\nchain = ${live}/chain.pem\nfullchain = ${live}/fullchain.pem\n\n[renewalparams]\naccount = 0123456789abcdef0123456789abcdef\nauthenticator = nginx\ninstaller = nginx\nserver = https://acme-v02.api.letsencrypt.org/directory\n`,
  );
  mkFile(join(letsencrypt, 'options-ssl-nginx.conf'), CERTBOT_OPTIONS_SSL_NGINX);
  const dh = await execa('openssl', ['genpkey', '-genparam', '-algorithm', 'DH', '-pkeyopt', 'dh_param:ffdhe2048']);
  mkFile(join(letsencrypt, 'ssl-dhparams.pem'), `${dh.stdout}\n`);

  // dstack's unit, enabled and running under the daemonless systemctl.
  const sysroot = join(dir, 'sysroot');
  const sc = systemctlReplacement(sysroot);
  mkFile(join(sc.unitDir, 'dstack.gateway.service'), dstackUnit(dstackHome));
  // The replacement takes WorkingDirectory inside its --root: the home is linked in there.
  mkdirSync(dirname(join(sysroot, dstackHome)), { recursive: true });
  symlinkSync(dstackHome, join(sysroot, dstackHome));
  await execa(sc.argv[0]!, [...sc.argv.slice(1), 'daemon-reload'], { reject: false });
  await execa(sc.argv[0]!, [...sc.argv.slice(1), 'enable', 'dstack.gateway']);
  await execa(sc.argv[0]!, [...sc.argv.slice(1), 'start', 'dstack.gateway']);

  const nginxPid = async () => {
    try {
      const pid = Number((await readFile(pidFile, 'utf8')).trim());
      return pid > 0 && alive(pid) ? pid : undefined;
    } catch {
      return undefined;
    }
  };
  const appPid = () => {
    try {
      const pid = Number(readFileSync(appPidFile, 'utf8').trim());
      return pid > 0 && alive(pid) ? pid : undefined;
    } catch {
      return undefined;
    }
  };
  return {
    dir,
    root: join(dir, 'opt', 'dstack-proxy'),
    dstackHome,
    nginxConf,
    sitesEnabled,
    sitesDir: join(etcNginx, 'dstack-proxy'),
    letsencrypt,
    accessLog,
    domain,
    defaultPort: defaultPort!,
    httpPort: httpPort!,
    httpsPort: httpsPort!,
    systemctl: sc.argv,
    unitDir: sc.unitDir,
    appPidFile,
    async startNginx() {
      await execa('nginx', ['-c', nginxConf]);
    },
    async reloadNginx() {
      await execa('nginx', ['-c', nginxConf, '-s', 'reload']);
    },
    nginxPid,
    async cleanup() {
      // Only the processes this layout started: its Nginx master (by its pid file) and the app.
      await execa(sc.argv[0]!, [...sc.argv.slice(1), 'stop', 'dstack.gateway'], { reject: false, timeout: 30_000 });
      const app = appPid();
      if (app) process.kill(app, 'SIGKILL');
      const pid = await nginxPid();
      if (pid) {
        process.kill(pid, 'SIGQUIT');
        for (let i = 0; i < 100 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
        if (alive(pid)) process.kill(pid, 'SIGKILL');
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
