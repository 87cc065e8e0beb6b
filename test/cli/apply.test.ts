import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyCommand, createApplyCommand, waitForConvergence } from '../../src/cli/apply.js';
import type { StatusResponse } from '../../src/cli/client.js';
import { UsageError } from '../../src/cli/command.js';
import { request } from '../helpers/http.js';
import { freePort } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { ANSI, captureIo, startTestGateway, type TestGateway } from './client-fixture.js';

const EXAMPLE = 'examples/local-state.yaml';
const t = tmpDir();
let gw: TestGateway;
let breakSites = true;

beforeAll(async () => {
  // While breakSites is set, a site named broken.* gets a directive nginx -t rejects: a real
  // rejection by the real nginx.
  gw = await startTestGateway(
    {},
    { renderHook: (name, text) => (breakSites && name.includes('broken.') ? `${text}\nno_such_directive on;\n` : text) },
  );
}, 60_000);
afterAll(async () => {
  await gw?.stop();
  t.cleanup();
});

function file(name: string, text: string): string {
  const p = path.join(t.dir, name);
  writeFileSync(p, text);
  return p;
}

function doc(domains: string[], clientMaxBodySize?: number): string {
  return JSON.stringify({
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'demo' }],
      services: domains.map((domain, i) => ({
        project: 'demo',
        run: `svc${i}`,
        domain,
        https: false, // no ACME server here: an https service would wait for a certificate
        ...(clientMaxBodySize ? { clientMaxBodySize } : {}),
        replicas: [{ id: `r${i}`, appPort: 18001, direct: { host: '127.0.0.1', port: 18001 } }],
      })),
    },
  });
}

async function apply(args: string[]) {
  const io = captureIo();
  const code = await applyCommand.run([...args, '--url', gw.url], io);
  return { code, stdout: io.stdoutText, stderr: io.stderrText };
}

describe('dstack-proxy apply', () => {
  it('stores the document, shows progress, and returns once converged', async () => {
    const r = await apply(['-f', EXAMPLE]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('applied generation 1: 4 added, 0 changed, 0 removed');
    expect(lines).toContain('nginx: 2/2 objects ready'); // the global file and the site
    expect(lines.at(-1)).toMatch(/^converged: generation 1 in \d+\.\ds$/);
    // One line per change of progress, not one per poll.
    expect(new Set(lines).size).toBe(lines.length);
    expect(r.stdout).not.toMatch(ANSI);
  });

  it("leaves nginx routing the site (its direct replicas refuse: the balancer's 502, not the default 404)", async () => {
    const httpPort = Number(/listen 127\.0\.0\.1:(\d+)/.exec(await readSite('hello.localhost'))?.[1]);
    const reply = await request({ port: httpPort, host: 'hello.localhost' });
    // Direct replicas count as Ready; nothing listens on their ports, so every one refused.
    expect(reply.status).toBe(502);
    expect(JSON.parse(reply.body)).toEqual({ detail: 'Error requesting upstream' });
  });

  it('says "no changes" for the same document and exits 0', async () => {
    expect(await apply(['-f', EXAMPLE])).toEqual({ code: 0, stdout: 'no changes (generation 1)\n', stderr: '' });
  });

  it('rejects an invalid document with one path: message line per error, exit 1, nothing stored', async () => {
    const bad = file(
      'bad.yaml',
      'apiVersion: proxy.dstack.ai/v1alpha1\nkind: ProxyState\nspec:\n  projects: [{ name: demo }]\n  services:\n    - { project: demo, run: x, domain: "x.example.com;", replicas: [] }\n',
    );
    const r = await apply(['-f', bad]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr.split('\n')[0]).toBe('dstack-proxy apply: the gateway rejected the document:');
    expect(r.stderr).toContain(`/spec/services/0/domain: must be a host name (letters, digits, '-' and '.'); ";" is not allowed.\n`);
    expect((await gw.gateway.store.read()).generation).toBe(1);
  });

  it('refuses with --if-match naming another generation, exit 1', async () => {
    const r = await apply(['-f', file('two.json', doc(['a.localhost'])), '--if-match', '7']);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe('dstack-proxy apply: If-Match is 7; the current generation is 1 (DP_ERR_GENERATION_MISMATCH, HTTP 409)\n');
    const ok = await apply(['-f', file('two.json', doc(['a.localhost'])), '--if-match', '1']);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain('applied generation 2: ');
  });

  it('exits 1 listing the object nginx rejected', async () => {
    const r = await apply(['-f', file('broken.json', doc(['a.localhost', 'broken.localhost'])), '--timeout', '60s']);
    expect(r.code).toBe(1);
    expect(r.stdout.split('\n')[0]).toBe('applied generation 3: 2 added, 0 changed, 0 removed');
    expect(r.stderr).toMatch(/^generation 3 failed to converge:\n/);
    // One line for the one problem: the failing action (its object's condition says the same).
    expect(r.stderr).toMatch(
      /^generation 3 failed to converge:\n {2}nginx sites\/broken\.localhost\.conf: \[emerg\] unknown directive "no_such_directive" .*\(attempt \d+\)\n$/,
    );
  });

  it('converges again once the broken site renders valid config', async () => {
    breakSites = false;
    const r = await apply(['-f', file('fixed.json', doc(['a.localhost', 'broken.localhost'], 1024))]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('applied generation 4: 0 added, 2 changed, 0 removed');
    expect(r.stdout).toContain('nginx: 3/3 objects ready');
  });

  it('converges once a rejected site is removed from the document', async () => {
    breakSites = true;
    const broken = await apply(['-f', file('broken2.json', doc(['a.localhost', 'broken.localhost'], 2048)), '--timeout', '60s']);
    expect(broken.code).toBe(1);
    breakSites = false;
    const r = await apply(['-f', file('only-a.json', doc(['a.localhost'])), '--timeout', '60s']);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const status = await gw.gateway.app.inject({ method: 'GET', url: '/api/v1/status' });
    expect(Object.keys(status.json().loops.nginx.objects).sort()).toEqual(['a.localhost', 'global']);
  });

  it('says clearly when the gateway is not running, exit 1', async () => {
    const port = await freePort();
    const io = captureIo();
    expect(await applyCommand.run(['-f', EXAMPLE, '--url', `http://127.0.0.1:${port}`], io)).toBe(1);
    expect(io.stderrText).toMatch(/^dstack-proxy apply: cannot connect to the gateway at http:\/\/127\.0\.0\.1:\d+: connection refused/);
  });

  it('throws usage errors for bad flags (main exits 2)', async () => {
    await expect(applyCommand.run(['-f', EXAMPLE, '--timeout', 'soon'], captureIo())).rejects.toThrow(UsageError);
    await expect(applyCommand.run(['-f', EXAMPLE, '--if-match', 'x'], captureIo())).rejects.toThrow(UsageError);
    await expect(applyCommand.run([], captureIo())).rejects.toThrow(UsageError);
  });
});

describe('waitForConvergence', () => {
  const stuck: StatusResponse = {
    generation: 5,
    hash: 'h',
    ready: true,
    observedGeneration: 5,
    loops: {
      nginx: {
        conditions: [
          { type: 'Ready', status: 'True', reason: 'Converged', message: '', observedGeneration: 4, lastTransitionTime: new Date(0) },
        ],
        objects: {
          'a.localhost': {
            conditions: [
              { type: 'Ready', status: 'True', reason: 'Applied', message: '', observedGeneration: 4, lastTransitionTime: new Date(0) },
            ],
          },
        },
        failures: {},
      },
    },
  };

  /** Generation 4 of two sites, `ready` of them Ready; the loop has passed at 4 once both are. */
  const sites = (ready: string[]): StatusResponse => {
    const cond = (status: 'True' | 'False', reason: string, observedGeneration = 4) => ({
      type: 'Ready',
      status,
      reason,
      message: '',
      observedGeneration,
      lastTransitionTime: new Date(0),
    });
    const s: StatusResponse = structuredClone(stuck);
    s.loops.nginx!.conditions = [ready.length === 2 ? cond('True', 'Converged') : cond('True', 'Converged', 3)];
    s.loops.nginx!.objects = Object.fromEntries(
      ['a.localhost', 'b.localhost'].map((k) => [
        k,
        { conditions: [ready.includes(k) ? cond('True', 'Applied') : cond('False', 'Pending')] },
      ]),
    );
    return s;
  };

  it('prints each object as it becomes Ready, and the counts as lines when not on a terminal', async () => {
    let now = 0;
    const steps = [sites([]), sites(['a.localhost']), sites(['a.localhost', 'b.localhost'])];
    const io = captureIo();
    const client = { status: async () => ((now += 500), steps.shift() ?? sites(['a.localhost', 'b.localhost'])) };
    expect(await waitForConvergence(client, 4, 10_000, io, { pollIntervalMs: 0, now: () => now })).toBe(0);
    expect(io.stdoutText).toBe(
      [
        'nginx: 0/2 objects ready (waiting for a pass at generation 4)',
        '  ready nginx a.localhost (1.0s)',
        'nginx: 1/2 objects ready (waiting for a pass at generation 4)',
        '  ready nginx b.localhost (1.5s)',
        'nginx: 2/2 objects ready',
        'converged: generation 4 in 1.5s',
        '',
      ].join('\n'),
    );
  });

  it('on a terminal, redraws one line of counts under the objects as they become Ready', async () => {
    let now = 0;
    const steps = [sites([]), sites(['a.localhost']), sites(['a.localhost', 'b.localhost'])];
    const io = captureIo({ isTTY: true, env: { NO_COLOR: '1' } });
    const client = { status: async () => ((now += 500), steps.shift() ?? sites(['a.localhost', 'b.localhost'])) };
    expect(await waitForConvergence(client, 4, 10_000, io, { pollIntervalMs: 0, now: () => now })).toBe(0);
    const clear = '\r\x1b[2K';
    expect(io.stdoutText).toBe(
      'generation 4: nginx 0/2 ready (0.5s)' +
        `${clear}  ready nginx a.localhost (1.0s)\n` +
        'generation 4: nginx 1/2 ready (1.0s)' +
        `${clear}  ready nginx b.localhost (1.5s)\n` +
        'generation 4: nginx 2/2 ready (1.5s)' +
        `${clear}converged: generation 4 in 1.5s\n`,
    );
  });

  it('times out naming what is not ready (a fake clock, no waiting)', async () => {
    let now = 0;
    let polls = 0;
    const io = captureIo();
    const client = {
      status: async () => {
        polls++;
        now += 1000;
        return stuck;
      },
    };
    const code = await waitForConvergence(client, 5, 3000, io, { pollIntervalMs: 0, now: () => now });
    expect(code).toBe(1);
    expect(polls).toBeGreaterThanOrEqual(3);
    expect(io.stdoutText).toBe('nginx: 0/1 objects ready (waiting for a pass at generation 5)\n');
    expect(io.stderrText).toBe(
      'timed out after 3.0s waiting for generation 5; not ready:\n  nginx: has not finished a pass at generation 5\n',
    );
  });

  it('exits 1 on a failing key once the loop passed at the generation', async () => {
    const failing: StatusResponse = structuredClone(stuck);
    failing.loops.nginx!.conditions = [
      {
        type: 'Ready',
        status: 'False',
        reason: 'ActionsFailing',
        message: '1 failing: x: boom',
        observedGeneration: 5,
        lastTransitionTime: new Date(0),
      },
    ];
    failing.loops.nginx!.failures = { 'sites/x.conf': { message: 'boom', attempts: 2, terminal: false } };
    const io = captureIo();
    const code = await waitForConvergence({ status: async () => failing }, 5, 60_000, io, { pollIntervalMs: 0, now: () => 0 });
    expect(code).toBe(1);
    expect(io.stderrText).toBe('generation 5 failed to converge:\n  nginx sites/x.conf: boom (attempt 2)\n');
  });

  it('is exported as a factory taking the poll interval', () => {
    expect(createApplyCommand({ pollIntervalMs: 10 }).name).toBe('apply');
  });
});

async function readSite(domain: string): Promise<string> {
  const { readFile } = await import('node:fs/promises');
  return readFile(path.join(gw.gateway.paths.confDir, 'sites', `${domain}.conf`), 'utf8');
}
