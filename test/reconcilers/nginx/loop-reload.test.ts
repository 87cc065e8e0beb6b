// The Nginx loop's status around a reload whose previous workers keep accepting: the sites are
// not reported Applied (Ready=Unknown, ReloadUnconfirmed) until those workers stopped.

import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { Controller } from '../../../src/reconcilers/controller.js';
import { createNginxLoop } from '../../../src/reconcilers/nginx/loop.js';
import { NginxProcess } from '../../../src/reconcilers/nginx/nginx-process.js';
import type { AnyLoop } from '../../../src/reconcilers/types.js';
import { emptyState, type ProxyState } from '../../../src/spec/types.js';
import { request } from '../../helpers/http.js';
import { eventually, startTestNginx, type TestNginx } from '../../helpers/nginx.js';
import { service } from './fixtures.js';

let ng: TestNginx | undefined;
let proc: NginxProcess | undefined;
afterAll(async () => {
  await proc?.stop();
  await ng?.stop();
});

async function workersOf(master: number): Promise<number[]> {
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    if (st.slice(st.lastIndexOf(')') + 2).split(' ')[1] === String(master)) out.push(Number(name));
  }
  return out;
}

describe('Nginx loop: Applied only once the previous workers stopped accepting', () => {
  it('reports ReloadUnconfirmed at the reload deadline, then Applied once they are gone', async () => {
    ng = await startTestNginx({ start: false, main: { user: null } });
    proc = new NginxProcess({ paths: ng.paths, timeoutMs: 1_000 });
    await proc.start();
    let state: ProxyState = emptyState();
    let generation = 1;
    const loop = createNginxLoop({
      confDir: ng.paths.confDir,
      mainConfPath: ng.paths.confPath,
      test: ng.test,
      reload: () => proc!.reload(),
      view: { httpPort: ng.httpPort, httpsPort: ng.httpsPort, acmeWebroot: ng.acmeWebroot, accessLogPath: ng.accessLogPath },
    });
    const controller = new Controller({
      loops: [loop] as unknown as AnyLoop[],
      getSpec: () => ({ state, generation }),
      logger: pino({ level: 'silent' }),
    });
    try {
      await controller.start();
      const [worker] = await eventually(async () => {
        const w = await workersOf(proc!.pid!);
        return w.length === 1 ? w : undefined;
      });
      process.kill(worker!, 'SIGSTOP'); // cannot take the master's "shut down": keeps accepting
      state = {
        ...emptyState(),
        spec: {
          ...emptyState().spec,
          projects: [{ name: 'main' }],
          services: [service({ run: 'web', domain: 'web.gw.test', replicas: [] })],
        },
      };
      generation = 2;
      await controller.reconcileAll();
      const ready = () => controller.statuses().loops.nginx?.objects['web.gw.test']?.conditions.find((c) => c.type === 'Ready');
      expect(ready()).toMatchObject({ status: 'Unknown', reason: 'ReloadUnconfirmed' });
      expect(ready()!.message).toMatch(new RegExp(`pid ${worker}\\) still accept`));
      // A dry run (PUT ?dryRun=true) must not consume the confirmation.
      process.kill(worker!, 'SIGCONT');
      await eventually(async () => ((await workersOf(proc!.pid!)).includes(worker!) ? undefined : true));
      await controller.dryRun(state);
      await eventually(() => (ready()?.reason === 'Applied' ? true : undefined));
      expect(ready()).toMatchObject({ status: 'True', reason: 'Applied' });
      expect((await request({ port: ng.httpPort, host: 'web.gw.test', localAddress: '127.0.0.2' })).status).toBe(503);
    } finally {
      await controller.stop();
    }
  });
});

describe('Nginx loop: a reload the master is still parsing at the deadline', () => {
  it('keeps the files (no rollback, no second reload), reports ReloadUnconfirmed, then Applied once the master took them', async () => {
    const ng2 = await startTestNginx({ start: false, main: { user: null } });
    const proc2 = new NginxProcess({ paths: ng2.paths, timeoutMs: 1_000 });
    await proc2.start();
    let state: ProxyState = emptyState();
    let generation = 1;
    const hints: (number | undefined)[] = [];
    const loop = createNginxLoop({
      confDir: ng2.paths.confDir,
      mainConfPath: ng2.paths.confPath,
      test: ng2.test,
      reload: (hint) => {
        hints.push(hint?.testMs);
        return proc2.reload(hint);
      },
      view: { httpPort: ng2.httpPort, httpsPort: ng2.httpsPort, acmeWebroot: ng2.acmeWebroot, accessLogPath: ng2.accessLogPath },
    });
    const controller = new Controller({
      loops: [loop] as unknown as AnyLoop[],
      getSpec: () => ({ state, generation }),
      logger: pino({ level: 'silent' }),
    });
    const master = proc2.pid!;
    try {
      await controller.start();
      hints.length = 0;
      // A stopped master takes the SIGHUP only once continued: it stands for one that spends
      // longer than the deadline parsing a very large config.
      process.kill(master, 'SIGSTOP');
      state = {
        ...emptyState(),
        spec: {
          ...emptyState().spec,
          projects: [{ name: 'main' }],
          services: [service({ run: 'web', domain: 'web.gw.test', replicas: [] })],
        },
      };
      generation = 2;
      await controller.reconcileAll();
      const ready = () => controller.statuses().loops.nginx?.objects['web.gw.test']?.conditions.find((c) => c.type === 'Ready');
      expect(ready()).toMatchObject({ status: 'Unknown', reason: 'ReloadUnconfirmed' });
      expect(ready()!.message).toMatch(/has not finished reading the new config/);
      expect(hints).toHaveLength(1); // no rollback and reload again
      expect(hints[0]).toBeGreaterThan(0); // told how long nginx -t of the same files took
      expect((await readdir(join(ng2.paths.confDir, 'sites'))).filter((n) => n.endsWith('.conf'))).toEqual(['web.gw.test.conf']);
      process.kill(master, 'SIGCONT');
      await eventually(async () => {
        await controller.reconcileAll();
        return ready()?.reason === 'Applied' ? true : undefined;
      });
      expect(ready()).toMatchObject({ status: 'True', reason: 'Applied' });
      expect(hints).toHaveLength(1);
      expect((await request({ port: ng2.httpPort, host: 'web.gw.test', localAddress: '127.0.0.2' })).status).toBe(503);
    } finally {
      try {
        process.kill(master, 'SIGCONT');
      } catch {
        // already gone
      }
      await controller.stop();
      await proc2.stop();
      await ng2.stop();
    }
  });
});
