import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyCommand } from '../../src/cli/apply.js';
import { planCommand } from '../../src/cli/plan.js';
import { freePort } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { ANSI, captureIo, startTestGateway, type TestGateway } from './client-fixture.js';
import { keyBody, TEST_KEY_A, TEST_KEY_B } from '../helpers/keys.js';

const EXAMPLE = 'examples/local-state.yaml';
const t = tmpDir();
let gw: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway();
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

function withKey(key: string): string {
  return JSON.stringify({
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: [{ name: 'demo', sshPrivateKey: key }],
      services: [
        {
          project: 'demo',
          run: 'hello',
          domain: 'hello.localhost',
          https: false,
          replicas: [{ id: 'hello-0', appPort: 18001, direct: { host: '127.0.0.1', port: 18001 } }],
        },
      ],
    },
  });
}

async function plan(args: string[], opts: Parameters<typeof captureIo>[0] = {}) {
  const io = captureIo(opts);
  const code = await planCommand.run([...args, '--url', gw.url], io);
  return { code, stdout: io.stdoutText, stderr: io.stderrText };
}

// The tests run in order: an empty gateway, then the example applied, then a secret changed.
describe('dstack-proxy plan', () => {
  it('shows the document changes and the Nginx diff against an empty gateway, exit 2', async () => {
    const r = await plan(['-f', EXAMPLE]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(2);
    const lines = r.stdout.split('\n');
    expect(lines).toContain('Document (generation 0 → 1):');
    expect(lines).toContain('  + project demo');
    expect(lines).toContain('  + service demo/hello');
    expect(lines).toContain('  + replica demo/hello/hello-0');
    expect(lines).toContain('  + replica demo/hello/hello-1');
    expect(lines).toContain('  4 to add, 0 to change, 0 to remove');
    expect(lines).toContain('nginx: 1 action (reload)');
    expect(lines).toContain('  + create sites/hello.localhost.conf');
    expect(lines).toContain('    +++ b/sites/hello.localhost.conf');
    expect(lines.some((l) => /^ {4}@@ -0,0 \+1,\d+ @@$/.test(l))).toBe(true);
    expect(lines).toContain('    +    server_name hello.localhost;');
    expect(r.stdout).not.toMatch(ANSI);
  });

  it('changes nothing: the gateway is still at generation 0', async () => {
    expect((await gw.gateway.store.read()).generation).toBe(0);
  });

  it('colours the diff on a TTY, never with NO_COLOR', async () => {
    const tty = await plan(['-f', EXAMPLE], { isTTY: true });
    expect(tty.code).toBe(2);
    expect(tty.stdout).toContain('    \u001b[32m+    server_name hello.localhost;\u001b[39m\n');
    expect(tty.stdout).toMatch(/\u001b\[36m@@ -0,0/);
    const noColor = await plan(['-f', EXAMPLE], { isTTY: true, env: { NO_COLOR: '1' } });
    expect(noColor.code).toBe(2);
    expect(noColor.stdout).not.toMatch(ANSI);
  });

  it('reads the document from standard input with -f -', async () => {
    const { readFileSync } = await import('node:fs');
    const r = await plan(['-f', '-'], { stdin: readFileSync(EXAMPLE, 'utf8') });
    expect(r.code).toBe(2);
    expect(r.stdout).toContain('+ service demo/hello');
  });

  it('exits 0 with "No changes" once the document is applied', async () => {
    const io = captureIo();
    expect(await applyCommand.run(['-f', EXAMPLE, '--url', gw.url], io)).toBe(0);
    const r = await plan(['-f', EXAMPLE]);
    expect(r).toEqual({ code: 0, stdout: 'No changes: the gateway already matches this document (generation 1).\n', stderr: '' });
  });

  it('shows a changed secret only as <redacted>', async () => {
    expect(await applyCommand.run(['-f', file('k1.json', withKey(TEST_KEY_A)), '--url', gw.url], captureIo())).toBe(0);
    const r = await plan(['-f', file('k2.json', withKey(TEST_KEY_B))]);
    expect(r.code).toBe(2);
    expect(r.stdout).toContain('  ~ project demo\n      sshPrivateKey: <redacted> (changed)\n');
    for (const line of [...keyBody(TEST_KEY_A), ...keyBody(TEST_KEY_B)]) expect(r.stdout).not.toContain(line);
    // Nothing Nginx renders depends on the key: the loop has nothing to do.
    expect(r.stdout).toContain('nginx: nothing to do');
  });

  it('prints one path: message line per error of an invalid document, exit 1', async () => {
    const bad = file(
      'bad.yaml',
      `apiVersion: proxy.dstack.ai/v1alpha1
kind: ProxyState
spec:
  projects: [{ name: main }]
  services:
    - { project: nope, run: b, domain: "b.example.com", replicas: [{ id: r1, appPort: 80, direct: { host: 127.0.0.1, port: 80 } }] }
`,
    );
    const r = await plan(['-f', bad]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr.split('\n')).toEqual([
      'dstack-proxy plan: the gateway rejected the document:',
      '/spec/services/0/project: names project "nope", which is not in /spec/projects.',
      '',
    ]);
  });

  it('says clearly when the gateway is not running, exit 1', async () => {
    const port = await freePort();
    const io = captureIo();
    const code = await planCommand.run(['-f', EXAMPLE, '--url', `http://127.0.0.1:${port}`], io);
    expect(code).toBe(1);
    expect(io.stderrText).toBe(
      `dstack-proxy plan: cannot connect to the gateway at http://127.0.0.1:${port}: connection refused (is \`dstack-proxy gateway\` running? set --url or DSTACK_PROXY_URL)\n`,
    );
  });

  it('takes the URL from DSTACK_PROXY_URL', async () => {
    const io = captureIo({ env: { DSTACK_PROXY_URL: gw.url } });
    expect(await planCommand.run(['-f', EXAMPLE], io)).toBe(2);
  });

  it('exits 1 (not 2, which means changes) on usage errors', async () => {
    const io = captureIo();
    expect(await planCommand.run([], io)).toBe(1);
    expect(io.stderrText).toContain('-f FILE is required');
    expect(await planCommand.run(['-f', EXAMPLE, '--bogus'], captureIo())).toBe(1);
    expect(await planCommand.run(['-f', EXAMPLE, '--url', 'not a url'], captureIo())).toBe(1);
  });
});
