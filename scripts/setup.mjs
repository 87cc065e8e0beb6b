#!/usr/bin/env node
// Installs what `npm start`, `npm test` and `npm run bench` need and a fresh Debian machine
// lacks: the Debian packages in PACKAGES below and node_modules. Idempotent and quiet when
// everything is there. Plain Node (no dependencies): it runs before `npm ci`.

import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Debian package → a program it provides, checked on PATH or at an absolute path. */
const PACKAGES = [
  ['nginx-light', '/usr/sbin/nginx'],
  ['openssh-server', '/usr/sbin/sshd'],
  ['openssh-client', 'ssh'],
  ['certbot', 'certbot'],
  ['pebble', 'pebble'],
  ['wrk', 'wrk'],
  ['openssl', 'openssl'],
  ['postgresql', 'pg_ctlcluster'], // the tests start the cluster themselves (test/helpers/postgres.ts)
  ['systemd', 'systemd-analyze'], // `systemd-analyze verify` checks the host unit (test/host/render.test.ts)
  ['chromium', 'chromium'], // the status page in a real browser (test/e2e/status-page.test.ts)
];

function have(program) {
  if (program.startsWith('/')) return existsSync(program);
  return spawnSync('sh', ['-c', `command -v ${program}`], { stdio: 'ignore' }).status === 0;
}

function fail(message) {
  process.stderr.write(`setup: ${message}\n`);
  process.exit(1);
}

const missing = PACKAGES.filter(([, program]) => !have(program)).map(([pkg]) => pkg);
if (missing.length > 0) {
  const isRoot = process.getuid?.() === 0;
  if (!isRoot || !have('apt-get')) {
    fail(`missing Debian packages: ${missing.join(' ')}. Install them with:\n  sudo apt-get install -y ${missing.join(' ')}`);
  }
  process.stderr.write(`setup: installing ${missing.join(' ')} (apt-get)\n`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  try {
    execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit', env });
    execFileSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], { stdio: 'inherit', env });
  } catch {
    fail(`apt-get could not install ${missing.join(' ')}`);
  }
  const still = PACKAGES.filter(([pkg, program]) => missing.includes(pkg) && !have(program)).map(([pkg]) => pkg);
  if (still.length > 0) fail(`still missing after apt-get: ${still.join(' ')}`);
}

if (!existsSync(path.join(root, 'node_modules', '.package-lock.json'))) {
  process.stderr.write('setup: installing node modules (npm ci)\n');
  const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) fail('npm ci failed');
}
