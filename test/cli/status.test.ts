import { chmodSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyCommand } from '../../src/cli/apply.js';
import type { StatusResponse } from '../../src/cli/client.js';
import { age, parseDuration, table } from '../../src/cli/format.js';
import { assess, createStatusCommand, statusCommand } from '../../src/cli/status.js';
import type { Condition } from '../../src/reconcilers/conditions.js';
import { freePort } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { ANSI, captureIo, startTestGateway, type TestGateway } from './client-fixture.js';

const EXAMPLE = 'examples/local-state.yaml';
const TOKEN = 'status-test-token-0123456789';
const t = tmpDir();
const tokenFile = path.join(t.dir, 'token');
let gw: TestGateway;

beforeAll(async () => {
  writeFileSync(tokenFile, `${TOKEN}\n`);
  chmodSync(tokenFile, 0o600);
  gw = await startTestGateway({ apiTokenFile: tokenFile });
  const io = captureIo();
  const code = await applyCommand.run(['-f', EXAMPLE, '--url', gw.url, '--token-file', tokenFile], io);
  if (code !== 0) throw new Error(`apply failed: ${io.stderrText}`);
}, 60_000);
afterAll(async () => {
  await gw?.stop();
  t.cleanup();
});

async function status(args: string[], env: NodeJS.ProcessEnv = {}) {
  const io = captureIo({ env });
  const code = await statusCommand.run(args, io);
  return { code, stdout: io.stdoutText, stderr: io.stderrText };
}

describe('dstack-proxy status', () => {
  it('prints the generation, convergence, and a row per object', async () => {
    const r = await status(['--url', gw.url, '--token-file', tokenFile]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines[0]).toMatch(/^generation 1 \(observed 1, hash [0-9a-f]{12}\): converged$/);
    expect(lines[2]).toMatch(/^LOOP +OBJECT +READY +REASON +MESSAGE +AGE +IN-FLIGHT +REQUESTS$/);
    // A replica's row ends with its requests in flight now and sent so far (nothing sent yet).
    expect(lines.find((l) => l.startsWith('ssh') && l.includes('hello-0'))).toMatch(/ +\d+[smhd] +0 +0$/);
    expect(lines.find((l) => l.includes('hello.localhost'))).toMatch(
      /^nginx +hello\.localhost +True +Applied +served by nginx +\d+[smhd]$/,
    );
    expect(lines.find((l) => l.startsWith('nginx') && l.includes('(loop)'))).toMatch(
      /^nginx +\(loop\) +True +Converged +observed state matches desired state +\d+[smhd]$/,
    );
    expect(r.stdout).not.toMatch(ANSI);
  });

  it('reads the URL and the token file from the environment', async () => {
    const r = await status([], { DSTACK_PROXY_URL: gw.url, DSTACK_PROXY_TOKEN_FILE: tokenFile });
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('hello.localhost');
  });

  it('--json prints the raw status', async () => {
    const r = await status(['--url', gw.url, '--token-file', tokenFile, '--json']);
    expect(r.code).toBe(0);
    const s = JSON.parse(r.stdout) as StatusResponse;
    expect(s).toMatchObject({ generation: 1, observedGeneration: 1, ready: true });
    expect(s.loops.nginx?.objects['hello.localhost']?.conditions[0]).toMatchObject({ type: 'Ready', status: 'True', reason: 'Applied' });
  });

  it('without the token: exit 1 saying how to pass one', async () => {
    const r = await status(['--url', gw.url]);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(
      'dstack-proxy status: send the API token as Authorization: Bearer <token> (DP_ERR_UNAUTHORIZED, HTTP 401); pass --token-file FILE (or DSTACK_PROXY_TOKEN_FILE)\n',
    );
    const wrong = path.join(t.dir, 'wrong');
    writeFileSync(wrong, 'not-the-token-at-all');
    expect((await status(['--url', gw.url, '--token-file', wrong])).stderr).toContain('the token in --token-file was refused');
  });

  it('says clearly when the gateway is not running, exit 1', async () => {
    const port = await freePort();
    const r = await status(['--url', `http://127.0.0.1:${port}`]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^dstack-proxy status: cannot connect to the gateway at http:\/\/127\.0\.0\.1:\d+: connection refused/);
  });

  it('shows ages from lastTransitionTime with an injected clock', async () => {
    const later = createStatusCommand({ now: () => Date.now() + 3 * 3_600_000 });
    const io = captureIo();
    expect(await later.run(['--url', gw.url, '--token-file', tokenFile], io)).toBe(0);
    expect(io.stdoutText.split('\n').find((l) => l.includes('hello.localhost'))).toMatch(/ 3h$/);
  });
});

const at = (gen: number, status: Condition['status'], reason: string, message = '', type = 'Ready'): Condition => ({
  type,
  status,
  reason,
  message,
  observedGeneration: gen,
  lastTransitionTime: new Date(0),
});

function snapshot(loopReady: Condition, objects: Record<string, Condition[]>, over: Partial<StatusResponse> = {}): StatusResponse {
  return {
    generation: 3,
    hash: 'h',
    ready: true,
    observedGeneration: 3,
    loops: {
      nginx: {
        conditions: [loopReady],
        objects: Object.fromEntries(Object.entries(objects).map(([k, conditions]) => [k, { conditions }])),
        failures: {},
      },
    },
    ...over,
  };
}

describe('assess(status, generation)', () => {
  const cases: [string, StatusResponse, { converged: boolean; failures: number; pending: number; ready: number }][] = [
    [
      'an object the pass at the generation did not touch counts as ready',
      snapshot(at(3, 'True', 'Converged'), { a: [at(1, 'True', 'Applied')], b: [at(3, 'True', 'Applied')] }),
      { converged: true, failures: 0, pending: 0, ready: 2 },
    ],
    [
      'a loop that has not passed at the generation is pending',
      snapshot(at(2, 'True', 'Converged'), { a: [at(2, 'True', 'Applied')] }),
      { converged: false, failures: 0, pending: 1, ready: 0 },
    ],
    [
      'a rejected object at the generation is a failure',
      snapshot(at(3, 'True', 'Converged'), { a: [at(3, 'False', 'ConfigRejected', 'bad')] }),
      { converged: false, failures: 1, pending: 0, ready: 0 },
    ],
    [
      'Degraded=True at the generation is a failure even while the old version serves',
      snapshot(at(3, 'True', 'Converged'), { a: [at(3, 'True', 'ServingPrevious'), at(3, 'True', 'ConfigRejected', 'bad', 'Degraded')] }),
      { converged: false, failures: 1, pending: 0, ready: 0 },
    ],
    [
      'an object still working (Ready=False, not a failure reason) is pending',
      snapshot(at(3, 'True', 'Converged'), { a: [at(3, 'False', 'Issuing', 'waiting for ACME')] }),
      { converged: false, failures: 0, pending: 1, ready: 0 },
    ],
    [
      'a failed pass of the loop at the generation is a failure',
      snapshot(at(3, 'False', 'PassFailed', 'EACCES'), {}),
      { converged: false, failures: 1, pending: 0, ready: 0 },
    ],
    [
      'a failure from an older pass does not count yet',
      snapshot(at(2, 'False', 'PassFailed', 'EACCES'), {}),
      { converged: false, failures: 0, pending: 1, ready: 0 },
    ],
    [
      'a controller that has not read the generation is pending',
      snapshot(at(3, 'True', 'Converged'), {}, { observedGeneration: 2 }),
      { converged: false, failures: 0, pending: 1, ready: 0 },
    ],
    [
      'a gateway before its first pass is pending',
      snapshot(at(3, 'True', 'Converged'), {}, { ready: false }),
      { converged: false, failures: 0, pending: 1, ready: 0 },
    ],
  ];
  it.each(cases)('%s', (_name, s, want) => {
    const a = assess(s, 3);
    expect({ converged: a.converged, failures: a.failures.length, pending: a.pending.length, ready: a.loops[0]?.ready ?? 0 }).toEqual(want);
  });
});

describe('format helpers', () => {
  it.each([
    [0, '0s'],
    [119_000, '119s'],
    [120_000, '2m'],
    [7_199_000, '119m'],
    [7_200_000, '2h'],
    [47 * 3_600_000, '47h'],
    [48 * 3_600_000, '2d'],
    [-5_000, '0s'],
  ])('age(%i) = %s', (ms, want) => expect(age(ms)).toBe(want));

  it.each([
    ['120s', 120_000],
    ['2m', 120_000],
    ['500ms', 500],
    ['1.5h', 5_400_000],
    ['90', 90_000],
    ['soon', null],
    ['0s', null],
    ['-1s', null],
  ])('parseDuration(%j) = %j', (text, want) => expect(parseDuration(text)).toBe(want));

  it('aligns table columns and leaves the last one unpadded', () => {
    expect(
      table(
        ['A', 'BB', 'C'],
        [
          ['xxx', 'y', 'z'],
          ['1', '22', ''],
        ],
      ),
    ).toBe('A    BB  C\nxxx  y   z\n1    22');
  });
});
