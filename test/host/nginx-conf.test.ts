// The main-conf patcher: the pure text patch on stock confs (Debian 12, Ubuntu 22.04), on one
// dstack's cloud-init edited, on an already patched one and on awkward syntax; then the file
// step with a real `nginx -t`: written only when the test passes, backed up once, idempotent.

import { execa } from 'execa';
import { mkdtemp, mkdir, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { BACKUP_SUFFIX, ensureNginxConf, patchNginxConf } from '../../src/host/nginx-conf.js';
import { DEBIAN_12_NGINX_CONF, UBUNTU_2204_NGINX_CONF } from './dstack-layout.js';

const SITES = '/etc/nginx/dstack-proxy';
const GLOBAL_INC = `include ${SITES}/*.conf;`;
const SITES_INC = `include ${SITES}/sites/*.conf;`;

/** The lines of `text` that are not comments or blank, trimmed. */
function live(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
}

describe('patchNginxConf', () => {
  for (const [name, stock] of [
    ['Debian 12', DEBIAN_12_NGINX_CONF],
    ['Ubuntu 22.04', UBUNTU_2204_NGINX_CONF],
  ] as const) {
    it(`patches ${name}'s stock nginx.conf with in-place edits only`, () => {
      const p = patchNginxConf(stock, SITES);
      expect(p.changed).toBe(true);
      expect(p.edits).toHaveLength(3);
      // The commented-out bucket size is the line that becomes ours; everything else is kept.
      expect(p.text).toContain('\tserver_names_hash_bucket_size 128;\n');
      expect(p.text).not.toContain('# server_names_hash_bucket_size 64;');
      expect(p.text).toContain('worker_processes auto;\nworker_rlimit_nofile 65535;\n');
      const tail = p.text.slice(p.text.indexOf('include /etc/nginx/sites-enabled/*;'));
      expect(tail).toMatch(
        new RegExp(
          `^include /etc/nginx/sites-enabled/\\*;\\n\\t# [^\\n]*\\n\\t${GLOBAL_INC.replace(/[*.]/g, '\\$&')}\\n\\t${SITES_INC.replace(/[*.]/g, '\\$&')}\\n\\}\\n`,
        ),
      );
      // Only our three additions differ from the stock text.
      const added = live(p.text).filter((l) => !live(stock).includes(l));
      expect(added.sort()).toEqual([GLOBAL_INC, SITES_INC, 'server_names_hash_bucket_size 128;', 'worker_rlimit_nofile 65535;'].sort());
      expect(live(stock).filter((l) => !live(p.text).includes(l))).toEqual([]);
      // The mail block stays commented out.
      expect(p.text).toContain('#mail {');
    });

    it(`leaves ${name}'s conf alone once patched`, () => {
      const once = patchNginxConf(stock, SITES);
      const twice = patchNginxConf(once.text, `${SITES}/`);
      expect(twice).toEqual({ text: once.text, changed: false, edits: [] });
    });
  }

  it("keeps dstack's sed edit (server_names_hash_bucket_size 128) and adds the rest", () => {
    const dstack = UBUNTU_2204_NGINX_CONF.replace('# server_names_hash_bucket_size 64;', 'server_names_hash_bucket_size 128;');
    const p = patchNginxConf(dstack, SITES);
    expect(p.edits.join('\n')).not.toContain('server_names_hash_bucket_size');
    expect(p.text.match(/server_names_hash_bucket_size/g)).toHaveLength(1);
    expect(p.text).toContain(SITES_INC);
    expect(p.text).toContain('worker_rlimit_nofile 65535;');
  });

  it('raises smaller values and keeps bigger ones', () => {
    const small = 'worker_rlimit_nofile 1024;\nevents {}\nhttp {\n  server_names_hash_bucket_size 64;\n}\n';
    const p = patchNginxConf(small, SITES);
    expect(p.text).toContain('worker_rlimit_nofile 65535;');
    expect(p.text).toContain('  server_names_hash_bucket_size 128;');
    expect(p.edits.filter((e) => e.includes('→'))).toHaveLength(2);
    const big = 'worker_rlimit_nofile 200000;\nevents {}\nhttp {\n  server_names_hash_bucket_size 1k;\n}\n';
    const q = patchNginxConf(big, SITES);
    expect(q.text).toContain('worker_rlimit_nofile 200000;');
    expect(q.text).toContain('server_names_hash_bucket_size 1k;');
    expect(q.edits).toHaveLength(1);
  });

  it('does not take a commented or nested directive for a live one', () => {
    const text = [
      '# worker_rlimit_nofile 999999;',
      'events { worker_connections 16; }',
      'http {',
      '    # include /etc/nginx/dstack-proxy/*.conf;',
      '    server {',
      '        listen 127.0.0.1:1;',
      '        # inside a server, not http: not ours',
      '    }',
      '    sendfile on; # server_names_hash_bucket_size 256;',
      '}',
      '',
    ].join('\n');
    const p = patchNginxConf(text, SITES);
    // The commented-out main-context line becomes the live one, at the smaller limit we need.
    expect(p.text.startsWith('worker_rlimit_nofile 65535;\n')).toBe(true);
    // A trailing comment after a directive is not a commented-out line.
    expect(p.text).toContain('    sendfile on; # server_names_hash_bucket_size 256;');
    expect(p.text).toContain('http {\n    server_names_hash_bucket_size 128;\n');
    expect(p.text).toContain(`    # include /etc/nginx/dstack-proxy/*.conf;`);
    expect(p.text.endsWith(`    ${GLOBAL_INC}\n    ${SITES_INC}\n}\n`)).toBe(true);
  });

  it('finds the http block past braces in comments and strings', () => {
    const text = [
      'events {}',
      '# a stray } in a comment {',
      'http {',
      '    log_format x \'{"host": "$host"} }\';',
      '    map $http_x $y { default "}"; }',
      '    server { return 200 "{ not a block"; location ~ "^/a{2}$" { return 204; } }',
      '} # the end }',
      '',
    ].join('\n');
    const p = patchNginxConf(text, SITES);
    expect(p.text).toContain(`    ${SITES_INC}\n} # the end }\n`);
    expect(p.text).toContain('http {\n    server_names_hash_bucket_size 128;\n    log_format');
    expect(patchNginxConf(p.text, SITES).changed).toBe(false);
  });

  it('puts a closing brace that shares a line back on its own', () => {
    const p = patchNginxConf('worker_processes 1; events {}\nhttp { sendfile on; }\n', SITES);
    expect(p.text).toBe(
      `worker_processes 1;\nworker_rlimit_nofile 65535; events {}\nhttp {\n    server_names_hash_bucket_size 128; sendfile on; \n    # the sites of dstack-proxy (its global file first)\n    ${GLOBAL_INC}\n    ${SITES_INC}\n}\n`,
    );
    expect(patchNginxConf(p.text, SITES).changed).toBe(false);
  });

  it('adds the missing one of the two includes in the right place, and refuses a wrong order', () => {
    const onlyGlobal = `events {}\nhttp {\n    ${GLOBAL_INC}\n    include /x/*;\n}\n`;
    expect(patchNginxConf(onlyGlobal, SITES).text).toContain(`    ${GLOBAL_INC}\n    ${SITES_INC}\n    include /x/*;\n`);
    const onlySites = `events {}\nhttp {\n    include "${SITES}/sites/*.conf";\n}\n`;
    expect(patchNginxConf(onlySites, SITES).text).toContain(`    ${GLOBAL_INC}\n    include "${SITES}/sites/*.conf";\n`);
    const swapped = `events {}\nhttp {\n    ${SITES_INC}\n    ${GLOBAL_INC}\n}\n`;
    expect(() => patchNginxConf(swapped, SITES)).toThrow(/global file must come first/);
  });

  it('refuses unparsable confs and unsafe paths', () => {
    expect(() => patchNginxConf('events {}\nhttp {\n', SITES)).toThrow(/line 2: the "http" block has no "}"/);
    expect(() => patchNginxConf('events {}\n}\n', SITES)).toThrow(/unexpected "}"/);
    expect(() => patchNginxConf('events {}\nhttp { sendfile on }\n', SITES)).toThrow(/no ";" before "}"/);
    expect(() => patchNginxConf('http { return 200 "x; }\n', SITES)).toThrow(/unterminated quoted string/);
    expect(() => patchNginxConf('events {}\n', SITES)).toThrow(/0 http blocks/);
    for (const bad of ['relative/dir', '/a b', '/a;b', '/a{b', '/a}b', '/a"b', "/a'b", '/a\nb', '/a#b', '/a$b']) {
      expect(() => patchNginxConf(DEBIAN_12_NGINX_CONF, bad), bad).toThrow(/absolute path/);
    }
  });
});

describe('ensureNginxConf', () => {
  const dirs: string[] = [];
  afterEach(async () => {
    for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
  });

  /** The Debian conf with every path moved into a temp dir, so a real `nginx -t` can run on it. */
  async function tempConf(): Promise<{ dir: string; conf: string; sitesDir: string }> {
    const dir = await mkdtemp(join(tmpdir(), 'dp-nginx-conf-'));
    dirs.push(dir);
    await mkdir(join(dir, 'etc', 'sites-enabled'), { recursive: true });
    await mkdir(join(dir, 'etc', 'conf.d'), { recursive: true });
    await mkdir(join(dir, 'log'), { recursive: true });
    await writeFile(join(dir, 'etc', 'mime.types'), 'types { text/html html; }\n');
    const text = DEBIAN_12_NGINX_CONF.replace('pid /run/nginx.pid;', `pid ${dir}/nginx.pid;`)
      .replace('include /etc/nginx/modules-enabled/*.conf;\n', '')
      .replaceAll('/etc/nginx/', `${dir}/etc/`)
      .replaceAll('/var/log/nginx/', `${dir}/log/`);
    const conf = join(dir, 'etc', 'nginx.conf');
    await writeFile(conf, text, { mode: 0o640 });
    return { dir, conf, sitesDir: join(dir, 'etc', 'dstack-proxy') };
  }

  const testCommand = ['nginx', '-t', '-q'];

  it('writes the tested patch once, with a backup of the original, and then changes nothing', async () => {
    const { dir, conf, sitesDir } = await tempConf();
    const original = await readFile(conf, 'utf8');
    const r = await ensureNginxConf({ nginxConf: conf, sitesDir, testCommand });
    expect(r.changed).toBe(true);
    expect(r.edits).toHaveLength(3);
    const patched = await readFile(conf, 'utf8');
    expect(patched).toBe(patchNginxConf(original, sitesDir).text);
    expect(await readFile(`${conf}${BACKUP_SUFFIX}`, 'utf8')).toBe(original);
    expect((await stat(conf)).mode & 0o777).toBe(0o640);
    expect((await stat(sitesDir)).mode & 0o777).toBe(0o755);
    expect((await stat(join(sitesDir, 'sites'))).isDirectory()).toBe(true);
    expect((await readdir(join(dir, 'etc'))).sort()).toEqual([
      'conf.d',
      'dstack-proxy',
      'mime.types',
      'nginx.conf',
      `nginx.conf${BACKUP_SUFFIX}`,
      'sites-enabled',
    ]);
    // The real Nginx accepts the result and would read a file in the sites dir.
    await writeFile(join(sitesDir, 'sites', 'a.conf'), 'server { listen 127.0.0.1:1; server_name a.test; }\n');
    await execa('nginx', ['-t', '-q', '-c', conf]);

    const before = await stat(conf);
    const again = await ensureNginxConf({ nginxConf: conf, sitesDir, testCommand });
    expect(again).toEqual({ changed: false, edits: [] });
    expect((await stat(conf)).mtimeMs).toBe(before.mtimeMs);
    expect(await readFile(`${conf}${BACKUP_SUFFIX}`, 'utf8')).toBe(original);
  });

  it('keeps the first backup when a later patch is needed', async () => {
    const { conf, sitesDir } = await tempConf();
    const original = await readFile(conf, 'utf8');
    await ensureNginxConf({ nginxConf: conf, sitesDir, testCommand });
    const other = `${sitesDir}-2`;
    const r = await ensureNginxConf({ nginxConf: conf, sitesDir: other, testCommand });
    expect(r.changed).toBe(true);
    expect(await readFile(conf, 'utf8')).toContain(`include ${other}/sites/*.conf;`);
    expect(await readFile(`${conf}${BACKUP_SUFFIX}`, 'utf8')).toBe(original);
  });

  it("leaves the original untouched and names nginx -t's complaint when the test fails", async () => {
    const { dir, conf, sitesDir } = await tempConf();
    const original = await readFile(conf, 'utf8');
    await mkdir(sitesDir, { recursive: true });
    await writeFile(join(sitesDir, 'broken.conf'), 'no_such_directive on;\n');
    const err = await ensureNginxConf({ nginxConf: conf, sitesDir, testCommand }).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/nginx -t -q -c <patched .*nginx\.conf> failed, .* is unchanged/);
    expect(err?.message).toContain('unknown directive "no_such_directive"');
    expect(await readFile(conf, 'utf8')).toBe(original);
    expect((await readdir(join(dir, 'etc'))).sort()).toEqual(['conf.d', 'dstack-proxy', 'mime.types', 'nginx.conf', 'sites-enabled']);
  });

  it('refuses unsafe paths and a missing conf before touching anything', async () => {
    const { dir, conf } = await tempConf();
    await expect(ensureNginxConf({ nginxConf: conf, sitesDir: `${dir}/a b`, testCommand })).rejects.toThrow(/absolute path/);
    await expect(ensureNginxConf({ nginxConf: 'nginx.conf', sitesDir: `${dir}/s`, testCommand })).rejects.toThrow(
      /nginxConf must be an absolute path/,
    );
    await expect(ensureNginxConf({ nginxConf: `${dir}/none.conf`, sitesDir: `${dir}/s`, testCommand })).rejects.toThrow(/cannot read/);
    await expect(ensureNginxConf({ nginxConf: conf, sitesDir: `${dir}/s`, testCommand: [] })).rejects.toThrow(/testCommand is empty/);
    expect((await readdir(dir)).sort()).toEqual(['etc', 'log']);
  });
});
