// A removal takes effect before the reload that drops the removed service's site, against the
// real private Nginx: a reload right after another waits out the minimum interval (15 s here),
// and meanwhile the site Nginx still has sends its requests to the data plane, which answers
// them as the new document says. A host no service has any more gets Nginx's own 404 (logged
// nowhere, counted nowhere); a host renamed to a service the default server may serve goes to
// that service at once; a host renamed to a service that needs its own site (a body limit of its
// own here) stays with the old service until that site is served.

import { readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, gatewayDoc, siteServed, startTestGateway, type SvcInput, type TestGateway } from '../helpers/gateway.js';
import { close, request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';

let before: Server;
let after: Server;
let beforePort: number;
let afterPort: number;
let t: TestGateway;

beforeAll(async () => {
  [beforePort, afterPort] = (await freePorts(2)) as [number, number];
  before = await startEcho('before', { port: beforePort });
  after = await startEcho('after', { port: afterPort });
  t = await startTestGateway({ deps: { nginxLoop: { minReloadIntervalMs: 15_000 } } });
}, 60_000);

afterAll(async () => {
  await t?.cleanup();
  for (const s of [before, after]) if (s) await close(s);
});

const NGINX_404 = /<center><h1>404 Not Found<\/h1><\/center>\s*<hr><center>nginx<\/center>/;

const get = (host: string, path = '/'): ReturnType<typeof request> => request({ port: t.httpPort, host, path });

/** Which echo answered, or the status when none did. */
const who = async (host: string): Promise<string> => {
  const r = await get(host);
  return r.status === 200 ? (JSON.parse(r.body) as { name: string }).name : String(r.status);
};

async function put(services: SvcInput[]): Promise<void> {
  const r = await api(t, { method: 'PUT', path: '/api/v1/state', body: gatewayDoc(services) });
  expect(r.status).toBe(200);
}

describe('a service removed from the document', () => {
  it('is an unknown host at once, while its site is still in Nginx; a renamed host goes where the document says', async () => {
    await put([
      { run: 'gone', ports: [beforePort] },
      { run: 'renamed', ports: [beforePort] },
      { run: 'limited', ports: [beforePort] },
      { run: 'kept', ports: [beforePort] },
    ]);
    for (const d of ['gone', 'renamed', 'limited', 'kept']) await siteServed(t, `${d}.gw.test`);
    const reloads = t.gw.nginxStats.reloads;

    await put([
      { run: 'renamed-2', domain: 'renamed.gw.test', ports: [afterPort] },
      { run: 'limited-2', domain: 'limited.gw.test', ports: [afterPort], clientMaxBodySize: 1024 },
      { run: 'kept', ports: [beforePort] },
    ]);
    // Through the site Nginx still has (its reload waits out the interval).
    const gone = await eventually(async () => {
      const r = await get('gone.gw.test', '/after-removal');
      return r.status === 404 ? r : undefined;
    }, 10_000);
    expect(gone.body).toMatch(NGINX_404);
    expect(await eventually(async () => ((await who('renamed.gw.test')) === 'after' ? true : undefined), 10_000)).toBe(true);
    // Its successor needs its own site (the body limit): the old service answers until then.
    expect(await who('limited.gw.test')).toBe('before');
    expect(await who('kept.gw.test')).toBe('before');
    // All of the above before the reload that drops the removed sites: the old workers answered.
    expect(t.gw.nginxStats.reloads).toBe(reloads);

    // Then the reload: the successor's own site, and the removed host is still unknown.
    await siteServed(t, 'limited.gw.test', 40_000);
    await eventually(async () => ((await who('limited.gw.test')) === 'after' ? true : undefined), 20_000);
    expect(await who('gone.gw.test')).toBe('404');
    // The retired services close once Nginx no longer routes to them.
    await eventually(
      async () => (t.gw.ssh.balancer.listening().some((k) => k === 'main/gone' || k === 'main/limited') ? undefined : true),
      20_000,
    );
    expect(await who('renamed.gw.test')).toBe('after');

    // The removed host's 404s were logged nowhere: the stats count nothing for it.
    const log = readFileSync(join(t.stateDir, 'logs', 'access.log'), 'utf8');
    expect(log.split('\n').filter((l) => l.includes(' gone.gw.test 404 '))).toEqual([]);
    expect(log).toMatch(/ kept\.gw\.test 200 /);
  }, 120_000);
});
