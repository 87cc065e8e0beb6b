// The compat write path over a real file store: a call that loses the race to another writer
// (an operator's PUT between its read and its write) is applied again to the newer document
// and keeps the other writer's change; calls run one at a time; a candidate the document
// refuses is a "<path>: <message>" refusal and writes nothing; an identical call writes nothing.

import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { applyCall } from '../../../src/compat/dstack/mapper.js';
import { compatWriter, MAX_WRITE_ATTEMPTS } from '../../../src/compat/dstack/store-write.js';
import { openFileStore } from '../../../src/state/file-store.js';
import type { StateStore } from '../../../src/state/store.js';
import type { ProxyState } from '../../../src/spec/index.js';
import { tmpDir } from '../../helpers/tmp.js';
import type { Call } from '../../../src/compat/dstack/calls.js';

const logger = pino({ level: 'silent' });
const dirs: ReturnType<typeof tmpDir>[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) d.cleanup();
});

async function store(): Promise<StateStore> {
  const d = tmpDir('dp-compat-write-');
  dirs.push(d);
  return openFileStore({ stateDir: d.dir });
}

const entrypoint = (project: string, domain: string): Call => ({ kind: 'registerEntrypoint', project, body: { domain, https: false } });

function withProject(state: ProxyState, name: string): ProxyState {
  return { ...state, spec: { ...state.spec, projects: [...state.spec.projects, { name }] } };
}

describe('compatWriter', () => {
  it('re-applies a call that lost the race to another writer, keeping that writer’s change', async () => {
    const s = await store();
    const writer = compatWriter(s, logger);
    let raced = 0;
    const answer = await writer.write(
      (cur) => {
        // The operator writes after our read, before our write, on the first two attempts.
        if (raced < 2) {
          raced++;
          void s.write(withProject(cur.state, `operator-${raced}`));
        }
        return applyCall(cur.state, entrypoint('main', 'gateway.main.example.test'));
      },
      { call: 'registerEntrypoint' },
    );
    expect(answer.kind).toBe('written');
    const stored = await s.read();
    expect(stored.state.spec.entrypoints).toEqual([{ project: 'main', domain: 'gateway.main.example.test', https: false }]);
    expect(stored.state.spec.projects.map((p) => p.name)).toEqual(expect.arrayContaining(['operator-1', 'operator-2', 'main']));
  });

  it('gives up after a bounded number of attempts', async () => {
    const s = await store();
    const writer = compatWriter(s, logger);
    let attempts = 0;
    const operator: Promise<unknown>[] = [];
    const racing = writer.write(
      (cur) => {
        attempts++;
        operator.push(s.write(withProject(cur.state, `operator-${attempts}`)));
        return applyCall(cur.state, entrypoint('main', 'gateway.main.example.test'));
      },
      { call: 'registerEntrypoint' },
    );
    await expect(racing).rejects.toMatchObject({ code: 'DP_ERR_GENERATION_MISMATCH' });
    expect(attempts).toBe(MAX_WRITE_ATTEMPTS);
    // A refused If-Match is answered at once; the operator's writes land on disk after it.
    await Promise.all(operator);
  });

  it('an identical call writes nothing; a refused candidate is "<path>: <message>" and writes nothing', async () => {
    const s = await store();
    const writer = compatWriter(s, logger);
    const first = await writer.write((cur) => applyCall(cur.state, entrypoint('main', 'gateway.main.example.test')), {});
    expect(first).toMatchObject({ kind: 'written', changed: true, generation: 1 });
    const again = await writer.write((cur) => applyCall(cur.state, entrypoint('main', 'gateway.main.example.test')), {});
    expect(again).toMatchObject({ kind: 'written', changed: false, generation: 1 });
    const bad = await writer.write((cur) => ({ kind: 'changed', state: withProject(cur.state, 'not a project') }), {});
    expect(bad.kind).toBe('refused');
    expect(bad.kind === 'refused' && bad.detail).toMatch(/^\/spec\/projects\/\d+\/name: /);
    expect((await s.read()).generation).toBe(1);
  });

  it('runs calls one at a time, in order', async () => {
    const s = await store();
    const writer = compatWriter(s, logger);
    const seen: number[] = [];
    await Promise.all(
      [0, 1, 2, 3, 4].map((i) =>
        writer.write((cur) => {
          seen.push(cur.generation);
          return applyCall(cur.state, entrypoint(`p${i}`, `gateway.p${i}.example.test`));
        }, {}),
      ),
    );
    expect(seen).toEqual([0, 1, 2, 3, 4]);
    expect((await s.read()).state.spec.entrypoints).toHaveLength(5);
  });

  it("probe validation: the mapper's probe decides, the normalised candidate is written as it is", async () => {
    const s = await store();
    const writer = compatWriter(s, logger, { validation: 'probe' });
    const a = await writer.write((cur) => applyCall(cur.state, entrypoint('main', 'gateway.main.example.test')), {});
    expect(a).toMatchObject({ kind: 'written', changed: true, generation: 1 });
    // The same document through a PUT's validation hashes the same: the candidate was normalised.
    const whole = await compatWriter(s, logger).write((cur) => ({ kind: 'changed', state: cur.state }), {});
    expect(whole).toMatchObject({ kind: 'written', changed: false, generation: 1 });
    const bad = await writer.write((cur) => {
      const o = applyCall(cur.state, entrypoint('other', 'gateway.other.example.test'));
      return o.kind === 'changed' && o.probe ? { ...o, probe: withProject(o.probe, 'not a project') } : o;
    }, {});
    expect(bad.kind).toBe('refused');
    expect((await s.read()).generation).toBe(1);
  });
});
