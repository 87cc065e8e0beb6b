// The import graph of src/ against the layer table in scripts/layering.mjs, and the README's
// Structure table against the same layer table. The checker itself is tested on small graphs
// first, so a green run means "no violation", not "nothing was looked at".

import { describe, expect, it } from 'vitest';
import {
  check,
  cycles,
  formatViolation,
  importGraph,
  importsOf,
  KNOWN_CYCLES,
  KNOWN_VIOLATIONS,
  LAYERS,
  placeOf,
  readmeTable,
  renderTable,
  sourceFiles,
  violations,
  type Edge,
  type Layer,
} from '../scripts/layering.mjs';

/** A value import `from → to` (both repository paths). */
const edge = (from: string, to: string, typeOnly = false): Edge => ({ from, to, specifier: to, typeOnly });
const lines = (edges: Edge[], layers: Layer[] = LAYERS) => violations(edges, layers).map(formatViolation);

describe('the layering checker', () => {
  it('reads value, type-only, re-export and dynamic imports', () => {
    const found = importsOf(
      'x.ts',
      [
        "import a from './a.js';",
        "import type { B } from './b.js';",
        "import { type C, type D } from './c.js';",
        "import { type E, f } from './e.js';",
        "import './side-effect.js';",
        "export { g } from './g.js';",
        "export type { H } from './h.js';",
        "export * from './star.js';",
        "import pino from 'pino';",
        "const lazy = () => import('./lazy.js');",
        "let t: import('./inline-type.js').T;",
      ].join('\n'),
    );
    expect(found).toEqual([
      { specifier: './a.js', typeOnly: false },
      { specifier: './b.js', typeOnly: true },
      { specifier: './c.js', typeOnly: true },
      { specifier: './e.js', typeOnly: false },
      { specifier: './side-effect.js', typeOnly: false },
      { specifier: './g.js', typeOnly: false },
      { specifier: './h.js', typeOnly: true },
      { specifier: './star.js', typeOnly: false },
      { specifier: 'pino', typeOnly: false },
      { specifier: './lazy.js', typeOnly: false },
      { specifier: './inline-type.js', typeOnly: true },
    ]);
  });

  it('places a file in its layer and unit: each loop folder is a unit of its own', () => {
    expect(placeOf('src/reconcilers/nginx/render.ts')).toMatchObject({ layer: { name: 'loop' }, unit: 'src/reconcilers/nginx/' });
    expect(placeOf('src/reconcilers/controller.ts')).toMatchObject({ layer: { name: 'controller' }, unit: 'src/reconcilers/' });
    expect(placeOf('src/server-proxy/raw/connection.ts')).toMatchObject({ layer: { name: 'front ends' }, unit: 'src/server-proxy/' });
    expect(placeOf('src/clock.ts')).toMatchObject({ layer: { name: 'ground' }, unit: 'src/clock.ts' });
    expect(placeOf('src/somewhere-new/x.ts')).toBeUndefined();
  });

  it('fails a loop importing another loop, and the data plane importing a loop or the API', () => {
    expect(
      lines([
        edge('src/reconcilers/tls/status.ts', 'src/reconcilers/nginx/view.ts', true),
        edge('src/server-proxy/upstream.ts', 'src/reconcilers/ssh/loop.ts'),
        edge('src/models/plugin.ts', 'src/api/auth.ts'),
        edge('src/spec/keys.ts', 'src/state/store.ts'),
        edge('src/errors.ts', 'src/spec/types.ts'),
      ]),
    ).toEqual([
      'src/reconcilers/tls/status.ts → src/reconcilers/nginx/view.ts (a loop never imports another loop)',
      'src/server-proxy/upstream.ts → src/reconcilers/ssh/loop.ts (front ends may not import loop; it may import front ends, dataplane, http1, stats, auth, spec, ground)',
      'src/models/plugin.ts → src/api/auth.ts (front ends may not import api; it may import front ends, dataplane, http1, stats, auth, spec, ground)',
      'src/spec/keys.ts → src/state/store.ts (spec may not import state; it may import ground)',
      'src/errors.ts → src/spec/types.ts (ground may not import spec; it may import ground)',
    ]);
  });

  it('passes imports the table allows: within a unit, down the layers, between data-plane folders', () => {
    expect(
      lines([
        edge('src/reconcilers/nginx/loop.ts', 'src/reconcilers/nginx/render.ts'),
        edge('src/reconcilers/nginx/loop.ts', 'src/reconcilers/outputs.ts'),
        edge('src/reconcilers/ssh/loop.ts', 'src/stats/frames.ts'),
        edge('src/models/plugin.ts', 'src/server-proxy/upstream.ts'),
        edge('src/daemon/gateway.ts', 'src/reconcilers/tls/index.ts'),
        edge('src/cli.ts', 'src/cli/main.ts'),
      ]),
    ).toEqual([]);
  });

  it('fails a file in no layer, an import out of src/, and a specifier that names no file', () => {
    expect(
      lines([
        edge('src/somewhere-new/x.ts', 'src/errors.ts'),
        edge('src/reconcilers/clock.ts', 'test/helpers/fake-clock.ts'),
        { from: 'src/spec/parse.ts', to: '', specifier: './gone.js', typeOnly: false },
      ]),
    ).toEqual([
      'src/somewhere-new/x.ts (in no layer: add its folder to LAYERS)',
      'src/reconcilers/clock.ts → test/helpers/fake-clock.ts (src/ imports only src/)',
      'src/spec/parse.ts → ./gone.js (names no file)',
    ]);
  });

  it('fails a cycle between folders and a value cycle between files; a type-only cycle inside a folder passes', () => {
    expect(
      lines([edge('src/models/forwarders.ts', 'src/models/upstream.ts'), edge('src/models/upstream.ts', 'src/models/forwarders.ts', true)]),
    ).toEqual([]);
    expect(lines([edge('src/models/a.ts', 'src/models/b.ts'), edge('src/models/b.ts', 'src/models/a.ts')])).toEqual([
      'src/models/a.ts → src/models/b.ts → src/models/a.ts (cycle of value imports)',
    ]);
    expect(
      lines([
        edge('src/models/plugin.ts', 'src/server-proxy/upstream.ts', true),
        edge('src/server-proxy/plugin.ts', 'src/models/index.ts', true),
      ]),
    ).toEqual(['src/models/ → src/server-proxy/ → src/models/ (cycle between folders)']);
  });

  it('reports a cycle as its shortest path back to its first node', () => {
    const pairs = [
      ['a', 'b'],
      ['b', 'c'],
      ['c', 'a'],
      ['b', 'a'],
      ['d', 'e'],
    ];
    expect(cycles(pairs)).toEqual([['a', 'b']]);
  });
});

describe('the layer table', () => {
  it('names only layers it defines, each once', () => {
    const names = LAYERS.map((l) => l.name);
    expect(new Set(names).size).toBe(names.length);
    for (const l of LAYERS) for (const n of l.mayImport) expect(names, `${l.name} may import ${n}`).toContain(n);
  });

  it('lists the layers from the ground up: each imports only layers listed before it, or its own kind', () => {
    LAYERS.forEach((l, i) => {
      const before = LAYERS.slice(0, i + 1).map((b) => b.name);
      for (const n of l.mayImport) expect(before, `${l.name} may import ${n}, listed after it`).toContain(n);
    });
  });

  it('gives a reason for every known exception', () => {
    for (const k of [...KNOWN_VIOLATIONS, ...KNOWN_CYCLES]) expect(k.why.length, JSON.stringify(k)).toBeGreaterThan(10);
  });
});

describe('src/', () => {
  const edges = importGraph();

  it('reads every source file and its relative imports', () => {
    const files = sourceFiles();
    expect(files).toContain('src/cli.ts');
    expect(edges.length).toBeGreaterThan(files.length);
    expect(edges).toContainEqual({ from: 'src/cli.ts', to: 'src/cli/main.ts', specifier: './cli/main.js', typeOnly: false });
  });

  it('imports only across the layering of scripts/layering.mjs', () => {
    const { violations: found, stale } = check(edges);
    expect(found.map(formatViolation), 'imports across the layering (from → to (rule))').toEqual([]);
    expect(stale, 'listed in KNOWN_VIOLATIONS or KNOWN_CYCLES but no longer found: delete them').toEqual([]);
  });

  it('is described by the README Structure table, rendered from the layer table', () => {
    expect(readmeTable(), 'README.md Structure table: run `node scripts/layering.mjs --write-readme`').toBe(renderTable());
  });
});
