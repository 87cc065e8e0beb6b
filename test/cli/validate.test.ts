import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from '../helpers/cli.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir();
afterAll(() => t.cleanup());

function file(name: string, text: string): string {
  const p = path.join(t.dir, name);
  writeFileSync(p, text);
  return p;
}

describe('dstack-proxy validate', () => {
  it('accepts the gateway example and counts what it holds', async () => {
    const r = await runCli(['validate', '-f', 'examples/gateway-state.yaml']);
    expect(r).toMatchObject({ code: 0, stdout: 'valid (3 services, 4 replicas)\n', stderr: '' });
  });

  it('accepts the local example', async () => {
    const r = await runCli(['validate', '-f', 'examples/local-state.yaml']);
    expect(r).toMatchObject({ code: 0, stdout: 'valid (1 service, 2 replicas)\n' });
  });

  it('reads standard input with -f -, JSON by content', async () => {
    const doc = { apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec: { projects: [{ name: 'p' }] } };
    const r = await runCli(['validate', '-f', '-'], { input: JSON.stringify(doc) });
    expect(r).toMatchObject({ code: 0, stdout: 'valid (0 services, 0 replicas)\n' });
  });

  it('prints one path: message line per error and exits 1', async () => {
    const p = file(
      'bad.yaml',
      `apiVersion: proxy.dstack.ai/v1alpha1
kind: ProxyState
spec:
  projects: [{ name: main }]
  services:
    - { project: main, run: a, domain: "a.example.com;", replicas: [{ id: r1, appPort: 80, direct: { host: 127.0.0.1, port: 80 } }] }
    - { project: nope, run: b, replicas: [{ id: r1, appPort: 80 }] }
`,
    );
    const r = await runCli(['validate', '-f', p]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const lines = r.stderr.trim().split('\n');
    expect(lines).toEqual([
      `/spec/services/0/domain: must be a host name (letters, digits, '-' and '.'); ";" is not allowed.`,
      '/spec/services/1/project: names project "nope", which is not in /spec/projects.',
      '/spec/services/1/replicas/0/id: duplicates replica id "r1" of /spec/services/0/replicas/0; replica ids are unique across the document.',
      "/spec/services/1/replicas/0: must have either 'ssh' or 'direct'.",
    ]);
  });

  it('reports malformed YAML with exit 1', async () => {
    const r = await runCli(['validate', '-f', file('broken.yaml', 'spec: [unclosed\n')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^\/: Malformed YAML/);
  });

  it('exits 2 on usage errors', async () => {
    expect((await runCli(['validate'])).code).toBe(2);
    expect((await runCli(['validate', '--nope'])).code).toBe(2);
    const missing = await runCli(['validate', '-f', path.join(t.dir, 'absent.yaml')]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('ENOENT');
    expect((await runCli(['frobnicate'])).code).toBe(2);
  });

  it('has --help for the program and the command', async () => {
    const top = await runCli(['--help']);
    expect(top.code).toBe(0);
    expect(top.stdout).toContain('validate');
    const cmd = await runCli(['validate', '--help']);
    expect(cmd.code).toBe(0);
    expect(cmd.stdout).toContain('Usage: dstack-proxy validate -f FILE');
  });
});
