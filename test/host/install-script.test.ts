// The bootstrap script, run for real: the pinned Node and npm packages served by a loopback
// stand-in registry, the package from a tarball of this checkout (`npm run build` first), all
// under a temporary root. `host install` itself (after the hand-over) is tested on its own; here
// it is replaced by a stub that records its argv where the hand-over's exact arguments matter.

import { execFile, execFileSync } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  INSTALL_SCRIPT,
  packTarball,
  registryPath,
  runtimePackages,
  scriptPins,
  startRuntimeRegistry,
  startTarballRegistry,
} from './fixtures.js';

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * The script run through `sh` with its path, the way the package's bin runs it, or fed on
 * stdin (`sh -s --`), the way `curl … | sh -s --` does; async so the registry keeps serving.
 */
function runScript(
  args: string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv; stdin?: boolean; prefix?: string[] } = {},
): Promise<Run> {
  const argv = [...(options.prefix ?? []), 'sh', ...(options.stdin ? ['-s', '--'] : [INSTALL_SCRIPT]), ...args];
  return new Promise((resolve) => {
    const child = execFile(
      argv[0]!,
      argv.slice(1),
      { cwd: options.cwd ?? tmpdir(), env: options.env ?? process.env, maxBuffer: 64 * 1024 * 1024, timeout: 600_000 },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
    if (options.stdin) child.stdin!.end(readFileSync(INSTALL_SCRIPT));
    else child.stdin!.end();
  });
}

/** A directory of stand-in commands (shell scripts) to put first on PATH. */
function stubCommands(dir: string, commands: Record<string, string>): string {
  mkdirSync(dir, { recursive: true });
  for (const [name, body] of Object.entries(commands)) {
    writeFileSync(join(dir, name), `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  }
  return dir;
}

/** Inode and mtime of every directory entry below `dir` (one level), to tell that nothing changed. */
function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(dir)) {
    const st = lstatSync(join(dir, name));
    out[name] = `${st.ino}:${st.mtimeMs}`;
  }
  const st = lstatSync(dir);
  out['.'] = `${st.ino}:${st.mtimeMs}`;
  return out;
}

const pins = scriptPins();
const NODE_DIR = `node-${pins.NODE_VERSION}`;
const NPM_DIR = `npm-${pins.NPM_VERSION}`;

const temps: string[] = [];
function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), `dstack-proxy-install-${prefix}-`));
  temps.push(dir);
  return dir;
}

afterAll(() => {
  for (const dir of temps) rmSync(dir, { recursive: true, force: true });
});

describe('dstack-proxy-install: the script', () => {
  it('parses under dash and sh', () => {
    execFileSync('dash', ['-n', INSTALL_SCRIPT]);
    execFileSync('sh', ['-n', INSTALL_SCRIPT]);
    expect(statSync(INSTALL_SCRIPT).mode & 0o111).toBe(0o111);
  });

  it('keeps its pins in the form the fixtures read', () => {
    expect(pins.NODE_VERSION).toMatch(/^\d+\.\d+\.\d+$/);
    expect(pins.NPM_VERSION).toMatch(/^\d+\.\d+\.\d+$/);
    for (const key of ['NODE_INTEGRITY_x64', 'NODE_INTEGRITY_arm64', 'NPM_INTEGRITY']) {
      expect(pins[key]).toMatch(/^sha512-[A-Za-z0-9+/]+=*$/);
    }
  });

  it('--help prints the usage and exits 0', async () => {
    const run = await runScript(['--help']);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('Usage: dstack-proxy-install');
    expect(run.stdout).toContain('--runtime-from URL');
  });

  it('an unknown option exits 2 with the usage', async () => {
    const root = tempDir('usage');
    const run = await runScript(['install', '--root', root, '--no-such-option']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain("dstack-proxy-install: unknown option '--no-such-option'");
    expect(run.stderr).toContain('Usage: dstack-proxy-install');
    expect(readdirSync(root)).toEqual([]);
  });

  it("adopt takes no --config (it writes an adopted host's config itself)", async () => {
    const root = tempDir('adopt-usage');
    const run = await runScript(['adopt', '--root', root, '--config', '/tmp/x.yaml']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('dstack-proxy-install: adopt writes the config of an adopted host itself');
    expect(readdirSync(root)).toEqual([]);
  });

  it('an unknown verb exits 2 with the usage', async () => {
    const run = await runScript(['frobnicate']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain("dstack-proxy-install: unknown verb 'frobnicate'");
    expect(run.stderr).toContain('Usage: dstack-proxy-install');
  });

  it('install refuses to run as another user than root, saying so', async () => {
    // The tests run as root; setpriv drops to nobody for this one run. The script comes on
    // stdin (as with curl | sh): nobody may not be able to read the checkout (a clone in /root).
    const root = join(tempDir('nonroot'), 'root');
    const run = await runScript(['install', '--root', root, '--skip-packages'], {
      prefix: ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups'],
      stdin: true,
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toBe(
      'dstack-proxy-install: install must run as root (it installs packages and a system service); rerun with sudo\n',
    );
    expect(existsSync(root)).toBe(false);
  });

  it('an option without its value, or one the verb does not take, exits 2', async () => {
    const noValue = await runScript(['runtime', '--root']);
    expect(noValue.code).toBe(2);
    expect(noValue.stderr).toContain('dstack-proxy-install: --root needs a value');
    const wrongVerb = await runScript(['runtime', '--package', 'dstack-proxy']);
    expect(wrongVerb.code).toBe(2);
    expect(wrongVerb.stderr).toContain('dstack-proxy-install: unknown option for runtime: --package');
  });
});

describe('dstack-proxy-install runtime', () => {
  let registry: Awaited<ReturnType<typeof startRuntimeRegistry>>;
  beforeAll(async () => {
    registry = await startRuntimeRegistry();
  }, 300_000);
  afterAll(async () => {
    await registry?.close();
  });

  it('installs the pinned node and npm, verified; a second run downloads nothing and changes nothing', async () => {
    // A root the script creates itself, so its mode is the script's.
    const root = join(tempDir('runtime'), 'root');
    const { node, npm } = runtimePackages();
    // A trailing slash on the registry base is tolerated.
    const first = await runScript(['runtime', '--root', root, '--runtime-from', `${registry.url}/`]);
    expect(first.stderr).not.toContain('integrity');
    expect(first.code).toBe(0);
    expect(first.stdout).toBe(`${NODE_DIR}\n`);
    expect(registry.hits.get(registryPath(node.name, node.version))).toBe(1);
    expect(registry.hits.get(registryPath(npm.name, npm.version))).toBe(1);

    const runtime = join(root, 'runtime');
    expect(readdirSync(runtime).sort()).toEqual([NODE_DIR, NPM_DIR]);
    const version = execFileSync(join(runtime, NODE_DIR, 'bin', 'node'), ['--version'], { encoding: 'utf8' });
    expect(version.trim()).toBe(`v${pins.NODE_VERSION}`);
    const npmVersion = execFileSync(join(runtime, NODE_DIR, 'bin', 'node'), [join(runtime, NPM_DIR, 'bin', 'npm-cli.js'), '--version'], {
      encoding: 'utf8',
    });
    expect(npmVersion.trim()).toBe(pins.NPM_VERSION);
    expect(readFileSync(join(runtime, NODE_DIR, '.integrity'), 'utf8').trim()).toBe(pins[`NODE_INTEGRITY_${process.arch}`]);
    expect(readFileSync(join(runtime, NPM_DIR, '.integrity'), 'utf8').trim()).toBe(pins.NPM_INTEGRITY);
    for (const dir of [root, runtime, join(runtime, NODE_DIR), join(runtime, NPM_DIR)]) {
      expect(statSync(dir).mode & 0o777).toBe(0o755);
    }

    const before = { runtime: snapshot(runtime), node: snapshot(join(runtime, NODE_DIR)), npm: snapshot(join(runtime, NPM_DIR)) };
    const second = await runScript(['runtime', '--root', root, '--runtime-from', registry.url]);
    expect(second.code).toBe(0);
    expect(second.stdout).toBe(`${NODE_DIR}\n`);
    expect(registry.hits.get(registryPath(node.name, node.version))).toBe(1);
    expect(registry.hits.get(registryPath(npm.name, npm.version))).toBe(1);
    expect({ runtime: snapshot(runtime), node: snapshot(join(runtime, NODE_DIR)), npm: snapshot(join(runtime, NPM_DIR)) }).toEqual(before);
  }, 300_000);

  it('runs on its own, fed to sh on stdin, and downloads with wget when there is no curl', async () => {
    // A PATH with only what the script needs, wget instead of curl.
    const dir = tempDir('wget');
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    const needed = [
      'sh',
      'mktemp',
      'rm',
      'mkdir',
      'chmod',
      'cat',
      'openssl',
      'tar',
      'gzip',
      'mv',
      'uname',
      'id',
      'tr',
      'readlink',
      'dirname',
      'basename',
      'ln',
      'wget',
    ];
    for (const name of needed) {
      const found = execFileSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).trim();
      symlinkSync(found, join(bin, name));
    }
    const root = join(dir, 'root');
    const { node } = runtimePackages();
    const before = registry.hits.get(registryPath(node.name, node.version)) ?? 0;
    const run = await runScript(['runtime', '--root', root, '--runtime-from', registry.url], {
      stdin: true,
      env: { ...process.env, PATH: bin },
    });
    expect(run.stderr).not.toContain('curl');
    expect(run.code).toBe(0);
    expect(run.stdout).toBe(`${NODE_DIR}\n`);
    expect(registry.hits.get(registryPath(node.name, node.version))).toBe(before + 1);
    expect(readdirSync(join(root, 'runtime')).sort()).toEqual([NODE_DIR, NPM_DIR]);
  }, 300_000);

  it('refuses a node tarball that does not match its pinned integrity, leaving nothing behind', async () => {
    const { node, npm } = runtimePackages();
    const dir = tempDir('tampered');
    const tampered = join(dir, `${node.name}-${node.version}.tgz`);
    copyFileSync(node.file, tampered);
    const bytes = readFileSync(tampered);
    const middle = bytes.length >> 1;
    bytes.writeUInt8(bytes.readUInt8(middle) ^ 0xff, middle);
    writeFileSync(tampered, bytes);
    const bad = await startTarballRegistry({
      [registryPath(node.name, node.version)]: tampered,
      [registryPath(npm.name, npm.version)]: npm.file,
    });
    try {
      const root = join(dir, 'root');
      const tmp = join(dir, 'tmp');
      execFileSync('mkdir', ['-p', tmp]);
      const run = await runScript(['runtime', '--root', root, '--runtime-from', bad.url], { env: { ...process.env, TMPDIR: tmp } });
      expect(run.code).not.toBe(0);
      expect(run.stdout).toBe('');
      const line = run.stderr.split('\n').find((l) => l.includes('integrity'));
      expect(line).toMatch(new RegExp(`^dstack-proxy-install: ${node.name}@${node.version} .*fails its integrity check`));
      expect(line).toContain(`expected ${pins[`NODE_INTEGRITY_${process.arch}`]}`);
      expect(line).toMatch(/got sha512-[A-Za-z0-9+/]+=*$/);
      expect(line).not.toContain(`got ${pins[`NODE_INTEGRITY_${process.arch}`]}`);
      expect(readdirSync(join(root, 'runtime'))).toEqual([]);
      // The download's private temporary directory went too.
      expect(readdirSync(tmp)).toEqual([]);
    } finally {
      await bad.close();
    }
  }, 300_000);

  it('a registry that does not have the package: one line naming the download, nothing left', async () => {
    const empty = await startTarballRegistry({});
    try {
      const root = tempDir('missing');
      const run = await runScript(['runtime', '--root', root, '--runtime-from', empty.url]);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(
        /^dstack-proxy-install: download of http:\/\/127\.0\.0\.1:\d+\/node-linux-\w+\/-\/node-linux-\w+-[\d.]+\.tgz failed: .*404.*$/m,
      );
      expect(readdirSync(join(root, 'runtime'))).toEqual([]);
    } finally {
      await empty.close();
    }
  });
});

describe('dstack-proxy-install install', () => {
  let registry: Awaited<ReturnType<typeof startRuntimeRegistry>>;
  let tarball: string;
  beforeAll(async () => {
    registry = await startRuntimeRegistry();
    tarball = packTarball(tempDir('pack'));
  }, 300_000);
  afterAll(async () => {
    await registry?.close();
  });

  it('installs the runtime and the package into blue, hands over to its host install; a second run reinstalls nothing', async () => {
    const root = join(tempDir('install'), 'root');
    const work = tempDir('cwd');
    // A relative tarball path: the script makes it absolute before npm and host install see it.
    copyFileSync(tarball, join(work, 'dstack-proxy-test.tgz'));
    const args = ['install', '--skip-packages', '--root', root, '--package', 'dstack-proxy-test.tgz', '--runtime-from', registry.url];
    const first = await runScript([...args, '--', '--no-such-host-install-option'], { cwd: work });
    // `host install` refuses the made-up option (or is not there yet): either way the script got
    // as far as the hand-over, with everything before it in place.
    expect(first.code).not.toBe(0);
    const blue = join(root, 'blue');
    const handOver = `dstack-proxy-install: handing over: ${blue}/node ${blue}/node_modules/dstack-proxy/dist/src/cli.js host install --root ${root} --slot blue --package ${join(work, 'dstack-proxy-test.tgz')} --runtime ${pins.NODE_VERSION} --runtime-from ${registry.url} --no-such-host-install-option`;
    expect(first.stderr.split('\n')).toContain(handOver);

    expect(existsSync(join(root, 'runtime', NODE_DIR, 'bin', 'node'))).toBe(true);
    expect(existsSync(join(blue, 'node_modules', 'dstack-proxy', 'package.json'))).toBe(true);
    expect(existsSync(join(blue, 'node_modules', 'better-sqlite3'))).toBe(false);
    expect(readlinkSync(join(blue, 'node'))).toBe(`../runtime/${NODE_DIR}/bin/node`);
    execFileSync(join(blue, 'node'), [join(blue, 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js'), '--help'], { stdio: 'pipe' });
    for (const dir of [root, blue]) expect(statSync(dir).mode & 0o777).toBe(0o755);
    // No staging directory left beside the slots.
    expect(readdirSync(root).sort()).toEqual(['blue', 'runtime']);

    // The copy shipped in the package (its second bin) is what host update runs for the
    // runtime: it finds the runtime in place and downloads nothing.
    const shipped = join(blue, 'node_modules', '.bin', 'dstack-proxy-install');
    expect(readlinkSync(shipped)).toBe('../dstack-proxy/host/dstack-proxy-install');
    const hitsBefore = new Map(registry.hits);
    const runtime = await new Promise<string>((resolve, reject) =>
      execFile(shipped, ['runtime', '--root', root, '--runtime-from', registry.url], (error, stdout) =>
        error ? reject(error) : resolve(stdout),
      ),
    );
    expect(runtime).toBe(`${NODE_DIR}\n`);
    expect(registry.hits).toEqual(hitsBefore);

    // What host install does once it succeeds: the active slot is named in `version`. From then
    // on install leaves the slot alone (changes go through update) and hands over again; a stub
    // in place of the CLI records the exact argv it was given.
    writeFileSync(join(root, 'version'), 'blue\n');
    const cli = join(blue, 'node_modules', 'dstack-proxy', 'dist', 'src', 'cli.js');
    const argvFile = join(work, 'argv.json');
    writeFileSync(
      cli,
      `import { writeFileSync } from 'node:fs';\nwriteFileSync(${JSON.stringify(argvFile)}, JSON.stringify(process.argv.slice(2)));\n`,
    );
    const before = { root: snapshot(root), blue: snapshot(blue), modules: snapshot(join(blue, 'node_modules')) };
    const hits = new Map(registry.hits);
    const config = join(work, 'config.yaml');
    const second = await runScript([...args, '--config', 'config.yaml', '--', '--extra', 'two words'], { cwd: work });
    expect(second.stderr).toContain(`${blue} already has the package`);
    expect(second.code).toBe(0);
    expect(JSON.parse(readFileSync(argvFile, 'utf8'))).toEqual([
      'host',
      'install',
      '--root',
      root,
      '--slot',
      'blue',
      '--package',
      join(work, 'dstack-proxy-test.tgz'),
      '--runtime',
      pins.NODE_VERSION,
      '--runtime-from',
      registry.url,
      '--config',
      config,
      '--extra',
      'two words',
    ]);
    expect(registry.hits).toEqual(hits);
    expect({ root: snapshot(root), blue: snapshot(blue), modules: snapshot(join(blue, 'node_modules')) }).toEqual(before);

    // adopt: the same bootstrap, handed over to host adopt instead (no --config: adopt writes
    // an adopted host's config itself).
    const adopt = await runScript(['adopt', ...args.slice(1), '--', '--dstack-home', '/nonexistent'], { cwd: work });
    expect(adopt.code).toBe(0);
    expect(JSON.parse(readFileSync(argvFile, 'utf8'))).toEqual([
      'host',
      'adopt',
      '--root',
      root,
      '--slot',
      'blue',
      '--package',
      join(work, 'dstack-proxy-test.tgz'),
      '--runtime',
      pins.NODE_VERSION,
      '--runtime-from',
      registry.url,
      '--dstack-home',
      '/nonexistent',
    ]);
    expect(registry.hits).toEqual(hits);
  }, 600_000);

  it('installs only the missing distribution packages, noninteractively, and nothing when all are there', async () => {
    // Stand-ins for dpkg-query and apt-get (the machine's own packages are not touched): certbot
    // and openssl are "missing"; apt-get records its calls. The runtime download then fails on
    // an empty registry, which ends the run right after the packages step.
    const dir = tempDir('apt');
    const log = join(dir, 'apt.log');
    const missing = join(dir, 'missing');
    writeFileSync(missing, 'certbot openssl');
    const bin = stubCommands(join(dir, 'bin'), {
      'dpkg-query': `for p in $(cat ${missing}); do [ "$p" = "$3" ] && { echo 'unknown ok not-installed'; exit 1; }; done; echo 'install ok installed'`,
      'apt-get': `echo "DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> ${log}`,
    });
    const empty = await startTarballRegistry({});
    try {
      const env = { ...process.env, PATH: `${bin}:${process.env.PATH}` };
      const args = ['install', '--root', join(dir, 'root'), '--runtime-from', empty.url];
      const first = await runScript(args, { env });
      expect(first.stderr).toContain('dstack-proxy-install: installing certbot openssl from the distribution');
      expect(first.stderr).toMatch(/^dstack-proxy-install: download of .* failed: .*404.*$/m);
      expect(first.code).toBe(1);
      expect(readFileSync(log, 'utf8')).toBe(
        'DEBIAN_FRONTEND=noninteractive update -qq\nDEBIAN_FRONTEND=noninteractive install -y -qq certbot openssl\n',
      );

      writeFileSync(missing, '');
      rmSync(log);
      const second = await runScript(args, { env });
      expect(second.code).toBe(1);
      expect(second.stderr).not.toContain('from the distribution');
      expect(existsSync(log)).toBe(false);
    } finally {
      await empty.close();
    }
  });

  it('a package that fails to install leaves no slot behind', async () => {
    const root = tempDir('failed');
    const run = await runScript(
      [
        'install',
        '--skip-packages',
        '--root',
        root,
        '--package',
        'https://127.0.0.1:1/no-such-package.tgz',
        '--runtime-from',
        registry.url,
      ],
      { env: { ...process.env, npm_config_fetch_retries: '0' } },
    );
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('dstack-proxy-install: npm install of https://127.0.0.1:1/no-such-package.tgz failed');
    expect(readdirSync(root).sort()).toEqual(['runtime']);
  }, 300_000);

  it('a tarball path that does not exist is refused before anything is installed', async () => {
    const root = tempDir('nopath');
    const run = await runScript([
      'install',
      '--skip-packages',
      '--root',
      root,
      '--package',
      './missing.tgz',
      '--runtime-from',
      registry.url,
    ]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('dstack-proxy-install: package ./missing.tgz does not exist');
    expect(readdirSync(root)).toEqual([]);
  });
});
