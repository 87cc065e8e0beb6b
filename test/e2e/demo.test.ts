// The README's first command: `npm start` runs scripts/demo.mjs (after setup and build).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { request } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir();
afterAll(() => t.cleanup());

describe('npm start (scripts/demo.mjs)', () => {
  it('serves the local example and prints the line to curl', async () => {
    const [httpPort, apiPort] = (await freePorts(2)) as [number, number];
    const child = spawn(process.execPath, ['scripts/demo.mjs'], {
      env: { ...process.env, DEMO_HTTP_PORT: String(httpPort), DEMO_API_PORT: String(apiPort), DEMO_STATE_DIR: join(t.dir, 'state') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    try {
      await eventually(() => (out.includes('is serving') ? true : undefined), 60_000);
      expect(out).toContain(`curl -H 'Host: hello.localhost' http://127.0.0.1:${httpPort}/`);
      const names = new Set<string>();
      for (let i = 0; i < 2; i++) {
        const r = await request({ port: httpPort, host: 'hello.localhost', path: `/x${i}` });
        expect(r.status).toBe(200);
        names.add((JSON.parse(r.body) as { replica: string }).replica);
      }
      expect([...names].every((n) => n === 'hello-0' || n === 'hello-1')).toBe(true);
    } finally {
      child.kill('SIGINT');
    }
    expect(await exited).toBe(0);
  });
});
