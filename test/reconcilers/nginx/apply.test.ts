// readOwned / diffFiles / applyFiles against a real private Nginx: candidate tree + nginx -t, held-back
// sites, rollback on a refused reload, foreign files, no-op applies.

import { mkdir, readdir, readFile, stat, unlink, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { applyFiles, CONFLICT_MESSAGE, diffFiles, readOwned, type ApplyFilesOptions } from '../../../src/reconcilers/nginx/apply.js';
import { MARKER, renderAll } from '../../../src/reconcilers/nginx/render.js';
import { buildViews } from '../../../src/reconcilers/nginx/view.js';
import { request } from '../../helpers/http.js';
import { startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { freePort } from '../../helpers/ports.js';
import { sampleState } from './fixtures.js';

let ng: TestNginx;
let reloads = 0;

function rendered(): Map<string, string> {
  return renderAll(
    buildViews(sampleState(), {
      httpPort: ng.httpPort,
      httpsPort: ng.httpsPort,
      acmeWebroot: ng.acmeWebroot,
      accessLogPath: ng.accessLogPath,
    }),
  );
}

function site(domain: string, body = 'return 200 "ok";'): string {
  return `${MARKER}\nserver {\n    server_name ${domain};\n    listen 127.0.0.1:${ng.httpPort};\n    location / { ${body} }\n}\n`;
}

async function apply(files: Map<string, string>, over: Partial<ApplyFilesOptions> = {}) {
  const changes = diffFiles(files, await readOwned(ng.paths.confDir));
  const result = await applyFiles({
    changes,
    sitesDir: ng.paths.confDir,
    mainConfPath: ng.paths.confPath,
    test: ng.test,
    reload: async () => {
      reloads++;
      await ng.reload();
    },
    ...over,
  });
  const names = (kind: string) => changes.filter((c) => c.kind === kind).map((c) => c.name);
  return { changes, names, result };
}

const conf = (name: string) => join(ng.paths.confDir, name);
const exists = (name: string) =>
  stat(conf(name)).then(
    () => true,
    () => false,
  );

beforeAll(async () => {
  ng = await startTestNginx();
});
afterAll(async () => {
  await ng?.stop();
});
beforeEach(async () => {
  // Start every test from the sample document applied.
  await apply(rendered());
  reloads = 0;
});

describe('applyFiles on a real Nginx', () => {
  it('applies the sample document: every file passes nginx -t and is served', async () => {
    const files = rendered();
    expect([...files.keys()]).toEqual([
      '00-dstack-proxy-global.conf',
      'sites/empty.gw.test.conf',
      'sites/gateway.gw.test.conf',
      'sites/llama-8b.gw.test.conf',
      'sites/plain.gw.test.conf',
    ]);
    for (const [name, text] of files) expect(await readFile(conf(name), 'utf8')).toBe(text);
    expect((await request({ port: ng.httpPort, host: 'empty.gw.test' })).status).toBe(503);
  });

  it('writes nothing and does not reload when the render is identical', async () => {
    const before = await stat(conf('sites/plain.gw.test.conf'));
    const files = rendered();
    expect(files.size).toBe(5);
    const { changes, result } = await apply(files);
    expect(changes).toEqual([]); // all 5 on disk as rendered
    expect(result).toEqual({ applied: [], heldBack: [], reloaded: false });
    expect(reloads).toBe(0);
    expect((await stat(conf('sites/plain.gw.test.conf'))).mtimeMs).toBe(before.mtimeMs);
  });

  it('tells the reload how long the slowest nginx -t of the same files took', async () => {
    const hints: (number | undefined)[] = [];
    const files = new Map(rendered());
    files.set('sites/hint.gw.test.conf', site('hint.gw.test'));
    const { result } = await apply(files, {
      // The sleep is a floor on the measured duration, whatever the machine's load.
      test: async (c) => {
        await new Promise((r) => setTimeout(r, 60));
        return ng.test(c);
      },
      reload: async (hint) => {
        hints.push(hint?.testMs);
        await ng.reload();
      },
    });
    expect(result).toMatchObject({ applied: ['sites/hint.gw.test.conf'], reloaded: true });
    expect(hints).toHaveLength(1);
    expect(hints[0]).toBeGreaterThanOrEqual(50);
  });

  it('holds back a broken site (named by nginx) and applies the others', async () => {
    const files = rendered();
    files.set('sites/a-good.gw.test.conf', site('a-good.gw.test'));
    files.set('sites/b-broken.gw.test.conf', site('b-broken.gw.test', 'return 200 "ok"; bogus_directive on;'));
    files.set('sites/plain.gw.test.conf', site('plain.gw.test', 'proxy_pass http;'));
    const previousPlain = await readFile(conf('sites/plain.gw.test.conf'), 'utf8');
    const { result } = await apply(files);
    expect(result.applied).toEqual(['sites/a-good.gw.test.conf']);
    expect(result.heldBack.map((h) => h.file).sort()).toEqual(['sites/b-broken.gw.test.conf', 'sites/plain.gw.test.conf']);
    const broken = result.heldBack.find((h) => h.file === 'sites/b-broken.gw.test.conf');
    expect(broken?.message).toContain('unknown directive "bogus_directive"');
    expect(broken?.message).toContain(conf('sites/b-broken.gw.test.conf')); // real path, not the candidate's
    expect(result.reloaded).toBe(true);
    expect(reloads).toBe(1);
    expect(await exists('sites/b-broken.gw.test.conf')).toBe(false); // created: left absent
    expect(await readFile(conf('sites/plain.gw.test.conf'), 'utf8')).toBe(previousPlain); // updated: previous kept
    expect((await request({ port: ng.httpPort, host: 'a-good.gw.test' })).body).toBe('ok');
    expect((await readdirCandidates()).length).toBe(0);
  });

  it('bisects when nginx names no file', async () => {
    const files = rendered();
    for (const n of ['a', 'b', 'c', 'd', 'e']) files.set(`sites/${n}.gw.test.conf`, site(`${n}.gw.test`));
    files.set('sites/c.gw.test.conf', site('c.gw.test', 'bogus_directive on;'));
    const test: ApplyFilesOptions['test'] = async (c) => {
      const r = await ng.test(c);
      return r.ok ? r : { ok: false, message: r.message }; // drop file and line
    };
    const { result } = await apply(files, { test });
    expect(result.heldBack.map((h) => h.file)).toEqual(['sites/c.gw.test.conf']);
    expect(result.applied.sort()).toEqual(['sites/a.gw.test.conf', 'sites/b.gw.test.conf', 'sites/d.gw.test.conf', 'sites/e.gw.test.conf']);
  });

  it('rolls the files back when Nginx refuses the reload', async () => {
    // nginx -t does not bind ports; the reload does and fails on a port someone else holds.
    const busyPort = await freePort();
    const busy: Server = createServer();
    await new Promise<void>((r) => busy.listen(busyPort, '127.0.0.1', r));
    try {
      const files = rendered();
      const previousPlain = await readFile(conf('sites/plain.gw.test.conf'), 'utf8');
      files.set('sites/plain.gw.test.conf', site('plain.gw.test', 'return 200 "new";'));
      files.set('sites/busy.gw.test.conf', `${MARKER}\nserver { listen 127.0.0.1:${busyPort}; return 200; }\n`);
      const { result } = await apply(files);
      expect(result.rolledBack).toBe(true);
      expect(result.reloaded).toBe(false);
      expect(result.applied).toEqual([]);
      expect(result.heldBack.map((h) => h.file).sort()).toEqual(['sites/busy.gw.test.conf', 'sites/plain.gw.test.conf']);
      expect(result.heldBack[0]?.message).toMatch(/reload failed: .*bind\(\)/);
      expect(reloads).toBe(2); // the refused one, then the one after the rollback
      expect(await readFile(conf('sites/plain.gw.test.conf'), 'utf8')).toBe(previousPlain);
      expect(await exists('sites/busy.gw.test.conf')).toBe(false);
      const r = await request({ port: ng.httpPort, host: 'plain.gw.test' });
      expect(r.status).toBe(502); // still the old config: proxies to the (absent) backend
    } finally {
      await new Promise<void>((r) => busy.close(() => r()));
    }
  });

  it('never reads, rewrites or deletes foreign files; a name clash is a conflict', async () => {
    const foreign = `server { server_name foreign.gw.test; listen 127.0.0.1:${ng.httpPort}; return 200 "foreign"; }\n`;
    const clash = `# hand-written\nserver { server_name plain2.gw.test; listen 127.0.0.1:${ng.httpPort}; return 200 "clash"; }\n`;
    await writeFile(conf('sites/foreign.gw.test.conf'), foreign);
    await writeFile(conf('sites/plain2.gw.test.conf'), clash);
    const files = rendered();
    files.delete('sites/plain.gw.test.conf'); // an owned file to delete
    files.set('sites/plain2.gw.test.conf', site('plain2.gw.test', 'return 200 "ours";'));
    const { names, result } = await apply(files);
    expect(names('conflict')).toEqual(['sites/plain2.gw.test.conf']);
    expect(names('delete')).toEqual(['sites/plain.gw.test.conf']);
    expect(result.applied).toEqual(['sites/plain.gw.test.conf']);
    expect(result.heldBack).toEqual([{ file: 'sites/plain2.gw.test.conf', message: CONFLICT_MESSAGE }]);
    expect(await exists('sites/plain.gw.test.conf')).toBe(false);
    expect(await readFile(conf('sites/foreign.gw.test.conf'), 'utf8')).toBe(foreign);
    expect(await readFile(conf('sites/plain2.gw.test.conf'), 'utf8')).toBe(clash);
    expect((await request({ port: ng.httpPort, host: 'foreign.gw.test' })).body).toBe('foreign');
    // clean up for the next test
    await Promise.all(['sites/foreign.gw.test.conf', 'sites/plain2.gw.test.conf'].map((n) => unlink(conf(n))));
  });

  it('holds back everything when the tree is broken without our changes', async () => {
    await mkdir(join(ng.paths.confDir, 'sites'), { recursive: true });
    await writeFile(conf('sites/zz-foreign-broken.conf'), 'server {\n');
    try {
      const files = rendered();
      files.set('sites/new.gw.test.conf', site('new.gw.test'));
      const { result } = await apply(files);
      expect(result).toMatchObject({ applied: [], reloaded: false });
      expect(result.heldBack).toEqual([{ file: 'sites/new.gw.test.conf', message: expect.stringContaining('zz-foreign-broken.conf') }]);
      expect(reloads).toBe(0);
    } finally {
      await unlink(conf('sites/zz-foreign-broken.conf'));
    }
  });
});

describe('testing the changed sites alone', () => {
  /** `nginx -t` that also records which files the candidate tree held, relative to it. */
  function recordingTest(seen: string[][]): ApplyFilesOptions['test'] {
    return async (candConf) => {
      const text = await readFile(candConf, 'utf8');
      const dir = /include (\S+)\/\*\.conf;/.exec(text)![1]!;
      const top = (await readdir(dir)).filter((n) => n.endsWith('.conf'));
      const sites = (await readdir(join(dir, 'sites')).catch(() => [])).map((n) => `sites/${n}`);
      seen.push([...top, ...sites].sort());
      return ng.test(candConf);
    };
  }

  it('puts the global file, the foreign files and the changed sites in the candidate, not the unchanged sites', async () => {
    await writeFile(conf('sites/zz-foreign.conf'), `server { server_name zz.gw.test; listen 127.0.0.1:${ng.httpPort}; return 200; }\n`);
    try {
      const files = rendered();
      files.set('sites/plain.gw.test.conf', site('plain.gw.test', 'return 200 "changed";'));
      files.set('sites/new.gw.test.conf', site('new.gw.test'));
      const seen: string[][] = [];
      const observed = await readOwned(ng.paths.confDir);
      const { result } = await apply(files, { test: recordingTest(seen), changedOnly: { foreign: observed.foreign } });
      expect(result).toMatchObject({ reloaded: true, heldBack: [] });
      expect(result.applied.sort()).toEqual(['sites/new.gw.test.conf', 'sites/plain.gw.test.conf']);
      expect(seen).toEqual([
        ['00-dstack-proxy-global.conf', 'sites/new.gw.test.conf', 'sites/plain.gw.test.conf', 'sites/zz-foreign.conf'],
      ]);
      // The reload parsed the whole tree: the unchanged sites are still served, the new one too.
      expect((await request({ port: ng.httpPort, host: 'new.gw.test' })).body).toBe('ok');
      expect((await request({ port: ng.httpPort, host: 'plain.gw.test' })).body).toBe('changed');
      expect((await request({ port: ng.httpPort, host: 'gateway.gw.test' })).status).not.toBe(404);
    } finally {
      await unlink(conf('sites/zz-foreign.conf'));
    }
  });

  it('still holds back a broken changed site, found in the smaller tree', async () => {
    const files = rendered();
    files.set('sites/a-good.gw.test.conf', site('a-good.gw.test'));
    files.set('sites/b-broken.gw.test.conf', site('b-broken.gw.test', 'bogus_directive on;'));
    const seen: string[][] = [];
    const { result } = await apply(files, { test: recordingTest(seen), changedOnly: { foreign: new Set() } });
    expect(result.applied).toEqual(['sites/a-good.gw.test.conf']);
    expect(result.heldBack).toEqual([{ file: 'sites/b-broken.gw.test.conf', message: expect.stringContaining('bogus_directive') }]);
    for (const names of seen) expect(names).not.toContain('sites/plain.gw.test.conf');
  });

  it('tests the whole tree when the global file changes (every site depends on it)', async () => {
    const files = rendered();
    const global = '00-dstack-proxy-global.conf';
    files.set(global, `${files.get(global)!}# changed\n`);
    const seen: string[][] = [];
    const { result } = await apply(files, { test: recordingTest(seen), changedOnly: { foreign: new Set() } });
    expect(result).toMatchObject({ applied: [global], reloaded: true });
    expect(seen).toEqual([[...rendered().keys()].sort()]);
  });

  it('scales the reload hint to the whole tree', async () => {
    const files = rendered();
    files.set('sites/hint.gw.test.conf', site('hint.gw.test'));
    const hints: number[] = [];
    const { result } = await apply(files, {
      // The sleep is a floor on the measured duration, whatever the machine's load.
      test: async (c) => {
        await new Promise((r) => setTimeout(r, 60));
        return ng.test(c);
      },
      reload: async (hint) => {
        hints.push(hint?.testMs ?? 0);
        await ng.reload();
      },
      changedOnly: { foreign: new Set() },
    });
    expect(result.reloaded).toBe(true);
    // 2 of 6 files tested (the global file and the new site): the hint counts 7/3 of the time.
    expect(hints[0]).toBeGreaterThanOrEqual(60 * (7 / 3) - 10);
  });
});

async function readdirCandidates(): Promise<string[]> {
  const names = [...(await readdir(ng.dir)), ...(await readdir(ng.paths.confDir))];
  return names.filter((n) => n.includes('candidate'));
}
