// A daemon's signals, in a process of its own: SIGTERM closes it gracefully even while a child
// process started with execa runs (execa's cleanup restores a signal's default action when it
// finds no other listener, which once cut the close short); a second SIGINT ends it at once, a
// second SIGTERM (a successor's, to a gateway a restart already told to stop) does not.

import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tmpDir } from '../helpers/tmp.js';

const tmp = tmpDir('dp-signals-');
afterAll(() => tmp.cleanup());

/** A daemon whose close takes `closeMs`, with `sleep 30` running under execa meanwhile. */
function script(closeMs: number): string {
  const file = join(tmp.dir, `daemon-${closeMs}.mjs`);
  writeFileSync(
    file,
    `import { execa } from ${JSON.stringify(resolve('node_modules/execa/index.js'))};
import { runUntilSignal } from ${JSON.stringify(resolve('dist/src/daemon/signals.js'))};
let child;
const daemon = { close: () => new Promise((r) => setTimeout(() => { child.kill(); process.stdout.write('closed\\n'); r(); }, ${closeMs})) };
const stopped = runUntilSignal('test', daemon, (s) => process.stderr.write(s));
// Started after the handlers, as a daemon's children are: its cleanup listens after ours.
child = execa('sleep', ['30']);
child.catch(() => undefined);
process.stdout.write('up\\n');
await stopped;
process.exitCode = 0;
`,
  );
  return file;
}

function run(
  file: string,
  signals: number,
  signal: NodeJS.Signals = 'SIGTERM',
): Promise<{ code: number | null; signal: string | null; out: string; err: string }> {
  return new Promise((done) => {
    const p = spawn(process.execPath, [file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out === 'up\n') for (let i = 0; i < signals; i++) setTimeout(() => p.kill(signal), 100 + i * 100);
    });
    p.once('exit', (code, signal) => done({ code, signal, out, err }));
  });
}

describe('runUntilSignal', () => {
  it('closes gracefully on SIGTERM while an execa child runs', async () => {
    const r = await run(script(300), 1);
    expect(r.signal).toBeNull();
    expect(r.code).toBe(0);
    expect(r.out).toBe('up\nclosed\n');
    expect(r.err).toContain('SIGTERM, shutting down');
  }, 20_000);

  it('ends at once on a second SIGINT, with 128 + its number', async () => {
    const r = await run(script(10_000), 2, 'SIGINT');
    expect(r.code).toBe(130);
    expect(r.out).toBe('up\n');
    expect(r.err).toContain('SIGINT again, exiting now');
  }, 20_000);

  it('goes on closing gracefully on a second SIGTERM', async () => {
    const r = await run(script(1_000), 2);
    expect(r.signal).toBeNull();
    expect(r.code).toBe(0);
    expect(r.out).toBe('up\nclosed\n');
    expect(r.err).toContain('SIGTERM again, already shutting down');
  }, 20_000);
});
