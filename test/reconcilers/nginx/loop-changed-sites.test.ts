// The Nginx loop tests the changed sites alone (the reload parses every site anyway); after a
// reload Nginx refused, its next apply tests the whole tree. Between two verifications a pass
// lists the conf dir but stats no owned file.

import { readdir, readFile, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Controller } from '../../../src/reconcilers/controller.js';
import { createNginxLoop } from '../../../src/reconcilers/nginx/loop.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import { emptyState, type ProxyState } from '../../../src/spec/types.js';
import { FakeClock } from '../../helpers/fake-clock.js';
import { request } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { service } from './fixtures.js';

let ng: TestNginx;
beforeAll(async () => {
  ng = await startTestNginx();
});
afterAll(async () => {
  await ng?.stop();
});

function withServices(n: number): ProxyState {
  const s = emptyState();
  s.spec.projects = [{ name: 'main' }];
  s.spec.services = Array.from({ length: n }, (_, i) => service({ run: `s${i}`, domain: `s${i}.gw.test` }));
  return s;
}

/** The site files a candidate tree held when nginx -t ran on it. */
async function sitesOf(candConf: string): Promise<string[]> {
  const dir = /include (\S+)\/sites\/\*\.conf;/.exec(await readFile(candConf, 'utf8'))![1]!;
  return (await readdir(join(dir, 'sites'))).sort();
}

describe('Nginx loop: nginx -t of the changed sites', () => {
  it('tests only the new site, and the whole tree after a refused reload', async () => {
    let state = withServices(3);
    let generation = 1;
    const tested: string[][] = [];
    let refuseNext = false;
    const loop = createNginxLoop({
      confDir: ng.paths.confDir,
      mainConfPath: ng.paths.confPath,
      test: async (c) => {
        tested.push(await sitesOf(c));
        return ng.test(c);
      },
      reload: async () => {
        if (refuseNext) {
          refuseNext = false;
          throw new Error('injected: nginx refused the new config');
        }
        await ng.reload();
      },
      view: { httpPort: ng.httpPort, httpsPort: ng.httpsPort, acmeWebroot: ng.acmeWebroot, accessLogPath: ng.accessLogPath },
    });
    const controller = new Controller({
      loops: [loop] as unknown as AnyLoop[],
      getSpec: () => ({ state, generation }),
      backoff: { baseMs: 20, maxMs: 50 },
      logger: pino({ level: 'silent' }),
    });
    try {
      await controller.start(); // the first apply: the global file is new, the whole tree is tested
      expect(tested.at(-1)).toEqual(['s0.gw.test.conf', 's1.gw.test.conf', 's2.gw.test.conf']);

      state = withServices(4);
      generation++;
      tested.length = 0;
      await controller.reconcileAll();
      expect(tested).toEqual([['s3.gw.test.conf']]);
      expect((await request({ port: ng.httpPort, host: 's3.gw.test' })).status).toBe(503); // served: no replica

      // A reload refused after a test of the changed site alone: the retry tests everything.
      state = withServices(5);
      generation++;
      tested.length = 0;
      refuseNext = true;
      await controller.reconcileAll();
      expect(tested).toEqual([['s4.gw.test.conf']]);
      // The key's retry timer runs the next pass.
      await eventually(async () => ((await request({ port: ng.httpPort, host: 's4.gw.test' })).status === 503 ? true : undefined));
      await controller.whenIdle();
      expect(tested.slice(1)).toEqual([['s0.gw.test.conf', 's1.gw.test.conf', 's2.gw.test.conf', 's3.gw.test.conf', 's4.gw.test.conf']]);
      expect((await request({ port: ng.httpPort, host: 's4.gw.test' })).status).toBe(503);

      // And once a reload went through, tests are of the changed sites again.
      state = withServices(6);
      generation++;
      tested.length = 0;
      await controller.reconcileAll();
      expect(tested).toEqual([['s5.gw.test.conf']]);
    } finally {
      await controller.stop();
    }
  });
});

describe('Nginx loop: sites rendered again only when their inputs change', () => {
  it('gives the files a full render gives, through changes, removals and new view options', async () => {
    const { buildViews } = await import('../../../src/reconcilers/nginx/view.js');
    const { renderAll } = await import('../../../src/reconcilers/nginx/render.js');
    const view = { httpPort: 8080, httpsPort: 8443, acmeWebroot: '/w', accessLogPath: '/l' };
    const loop = createNginxLoop({
      confDir: '/nonexistent',
      mainConfPath: '/nonexistent',
      test: ng.test,
      reload: async () => undefined,
      view,
    });
    const none = { generation: 1, observedGeneration: 1, loops: {} };
    const full = (s: ProxyState) => renderAll(buildViews(s, view));
    const check = (s: ProxyState) => expect([...loop.desired(s, none)]).toEqual([...full(s)]);
    let s = withServices(5);
    check(s);
    s = structuredClone(s);
    s.spec.services[2]!.clientMaxBodySize = 1024;
    check(s);
    s.spec.services.splice(1, 1);
    check(s);
    s.spec.services.push(service({ run: 'a-first', domain: 'a-first.gw.test' }));
    check(s);
    view.httpPort = 8081; // the view options changed: every site again
    check(s);
  });
});

describe('Nginx loop: owned files stat-checked at verification, listed on every pass', () => {
  it('repairs a deleted site at the next pass and a hand-edited one at the next verification', async () => {
    const clock = new FakeClock();
    const state = withServices(2);
    const loop = createNginxLoop({
      confDir: ng.paths.confDir,
      mainConfPath: ng.paths.confPath,
      verifyEveryMs: 60_000,
      test: ng.test,
      reload: () => ng.reload(),
      view: { httpPort: ng.httpPort, httpsPort: ng.httpsPort, acmeWebroot: ng.acmeWebroot, accessLogPath: ng.accessLogPath },
    });
    const controller = new Controller({
      loops: [loop] as unknown as AnyLoop[],
      getSpec: () => ({ state, generation: 1 }),
      clock,
      resyncIntervalMs: 3_600_000,
      logger: pino({ level: 'silent' }),
    });
    const site = (n: number): string => join(ng.paths.confDir, 'sites', `s${n}.gw.test.conf`);
    try {
      await controller.start();
      const s0 = await readFile(site(0), 'utf8');
      const s1 = await readFile(site(1), 'utf8');

      // An edit that keeps the file ours: between verifications no pass stats it.
      const edited = s0.replace(/client_max_body_size \d+;/, 'client_max_body_size 1;');
      expect(edited).not.toBe(s0);
      await writeFile(site(0), edited);
      // A removal: the listing of every pass sees it.
      await unlink(site(1));
      await controller.reconcileAll();
      expect(await readFile(site(1), 'utf8')).toBe(s1);
      expect(await readFile(site(0), 'utf8')).toBe(edited);

      // The verification after the interval finds the edit.
      clock.advance(60_000);
      await controller.reconcileAll();
      expect(await readFile(site(0), 'utf8')).toBe(s0);
      expect((await request({ port: ng.httpPort, host: 's0.gw.test' })).status).toBe(503); // served: no replica
    } finally {
      await controller.stop();
    }
  });
});
