#!/usr/bin/env node
// The layering of src/: which folder may import which. LAYERS below is the one place it is
// written down; test/layering.test.ts checks the import graph against it, and the README's
// Structure table is rendered from it (the test fails when the two disagree).
//
//   node scripts/layering.mjs                 print every violation, exit 1 if there is one
//   node scripts/layering.mjs --write-readme  rewrite the README's Structure table from LAYERS
//
// Plain Node (the TypeScript compiler is used only as a parser), so it runs without a build.

import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/**
 * A layer: the files it holds and the layers it may import.
 * - `paths`: `src/x/` is a folder and everything below it; `src/x.ts` is one file;
 *   `src/x/*.ts` is the files directly in a folder; `src/x/*\/` is each subfolder, and each
 *   subfolder is a unit of its own.
 * - Files of one unit (one folder, or one file) always import each other freely; between units,
 *   the target's layer must be in `mayImport`. A layer that does not list itself keeps its
 *   units apart: a loop never imports another loop.
 * @typedef {{ name: string, paths: string[], holds: string, mayImport: string[] }} Layer
 */

/** @type {Layer[]} From the ground up: a layer imports only layers listed before it, or its own kind. */
export const LAYERS = [
  {
    name: 'ground',
    paths: ['src/errors.ts', 'src/clock.ts', 'src/write-atomic.ts', 'src/option-table.ts', 'src/ssh2.ts'],
    holds:
      'the error catalog, the clock and its timers, the one atomic file write, the option table both daemons read, the ssh2 library as the process loads it',
    mayImport: ['ground'],
  },
  {
    name: 'spec',
    paths: ['src/spec/'],
    holds: 'the desired-state document: schema, parse, normalise, validate, hash, diff',
    mayImport: ['ground'],
  },
  {
    name: 'http1',
    paths: ['src/http1/'],
    holds: 'HTTP/1.1: message parser, header fields, client connections and pool',
    mayImport: ['ground'],
  },
  {
    name: 'stats',
    paths: ['src/stats/'],
    holds: 'request statistics: access-log tail, frames, collectors',
    mayImport: ['spec', 'http1', 'ground'],
  },
  {
    name: 'auth',
    paths: ['src/auth/'],
    holds: 'bearer token, the control-server check',
    mayImport: ['spec', 'http1', 'ground'],
  },
  {
    name: 'state',
    paths: ['src/state/'],
    holds: 'document stores: file, SQLite, PostgreSQL, and their watchers',
    mayImport: ['spec', 'ground'],
  },
  {
    name: 'dataplane',
    paths: ['src/dataplane/'],
    holds:
      "the data plane's core: replicas and their upstream pools, the per-request choice, the balancer sockets Nginx connects to, the errors every client-facing path answers with",
    mayImport: ['http1', 'spec', 'ground'],
  },
  {
    name: 'controller',
    paths: ['src/reconcilers/*.ts'],
    holds: 'the loop contract, the controller (queue, backoff, conditions), status and typed outputs',
    mayImport: ['spec', 'stats', 'ground'],
  },
  {
    name: 'loop',
    paths: ['src/reconcilers/*/'],
    holds: 'one folder per loop: nginx, tls, ssh',
    mayImport: ['controller', 'dataplane', 'spec', 'stats', 'ground'],
  },
  {
    name: 'front ends',
    paths: ['src/server-proxy/', 'src/models/'],
    holds: 'the in-server reverse proxy and the OpenAI-compatible model API, on the data plane',
    mayImport: ['front ends', 'dataplane', 'http1', 'stats', 'auth', 'spec', 'ground'],
  },
  {
    name: 'api',
    paths: ['src/api/'],
    holds: 'the fastify app: state, status, auth, stats and metrics routes',
    mayImport: ['controller', 'spec', 'state', 'stats', 'auth', 'http1', 'ground'],
  },
  {
    name: 'compat',
    paths: ['src/compat/'],
    holds: "dstack's gateway API as changes to the document: the request models, the pure call → document mapper, the routes",
    mayImport: ['api', 'controller', 'state', 'spec', 'http1', 'ground'],
  },
  {
    name: 'daemon',
    paths: ['src/daemon/', 'src/gateway/'],
    holds: '`assemble(profile)` and its two profiles, the gateway and the in-server proxy',
    mayImport: [
      'daemon',
      'compat',
      'api',
      'front ends',
      'dataplane',
      'loop',
      'controller',
      'state',
      'auth',
      'stats',
      'http1',
      'spec',
      'ground',
    ],
  },
  {
    name: 'host',
    paths: ['src/host/'],
    holds:
      'the gateway host: blue/green slots, the pinned runtime, the service unit and scripts, install, update with rollback, adoption of a dstack gateway',
    mayImport: ['daemon', 'state', 'spec', 'ground'],
  },
  {
    name: 'cli',
    paths: ['src/cli/'],
    holds: 'the commands',
    mayImport: [
      'host',
      'daemon',
      'compat',
      'api',
      'front ends',
      'dataplane',
      'loop',
      'controller',
      'state',
      'auth',
      'stats',
      'http1',
      'spec',
      'ground',
    ],
  },
  {
    name: 'main',
    paths: ['src/cli.ts'],
    holds: 'the executable',
    mayImport: ['cli'],
  },
];

/**
 * Imports the tree still has and the restructure removes: each is `from → to` as file paths,
 * with the reason it is allowed for now. An entry that no longer matches an import fails the
 * check, so each is deleted when the move that fixes it lands.
 * @type {{ from: string, to: string, why: string }[]}
 */
export const KNOWN_VIOLATIONS = [];

/**
 * Cycles between units that are known and allowed for now, each as the units in it (in any
 * order). Files of one unit may import each other in a circle only through type-only imports,
 * which are erased at compile time; a cycle of value imports between files is a violation
 * wherever it is.
 * @type {{ units: string[], why: string }[]}
 */
export const KNOWN_CYCLES = [];

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

// --- the import graph ---------------------------------------------------------------------

/**
 * @typedef {{ from: string, to: string, specifier: string, typeOnly: boolean }} Edge
 *   `from`/`to` are paths relative to the repository root; `to` is '' for a relative
 *   specifier that resolves to no file.
 */

/** Every .ts file under `dir` (relative to `root`), sorted. */
export function sourceFiles(root = ROOT, dir = 'src') {
  /** @type {string[]} */
  const out = [];
  const walk = (/** @type {string} */ rel) => {
    for (const entry of readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const child = `${rel}/${entry.name}`;
      if (entry.isDirectory()) walk(child);
      else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(child);
    }
  };
  walk(dir);
  return out.sort();
}

/**
 * The module specifiers of one file: import and export-from declarations (with whether they
 * are type-only) and `import()` calls.
 * @returns {{ specifier: string, typeOnly: boolean }[]}
 */
export function importsOf(/** @type {string} */ fileName, /** @type {string} */ text) {
  const sf = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, false, ts.ScriptKind.TS);
  /** @type {{ specifier: string, typeOnly: boolean }[]} */
  const out = [];
  for (const st of sf.statements) {
    if (ts.isImportDeclaration(st) && ts.isStringLiteral(st.moduleSpecifier)) {
      const c = st.importClause;
      // `import type {…}`, or `import {type a, type b}` with no default and no namespace.
      const typeOnly =
        c !== undefined &&
        (c.isTypeOnly ||
          (c.name === undefined &&
            c.namedBindings !== undefined &&
            ts.isNamedImports(c.namedBindings) &&
            c.namedBindings.elements.length > 0 &&
            c.namedBindings.elements.every((e) => e.isTypeOnly)));
      out.push({ specifier: st.moduleSpecifier.text, typeOnly });
    } else if (ts.isExportDeclaration(st) && st.moduleSpecifier && ts.isStringLiteral(st.moduleSpecifier)) {
      const c = st.exportClause;
      const typeOnly =
        st.isTypeOnly || (c !== undefined && ts.isNamedExports(c) && c.elements.length > 0 && c.elements.every((e) => e.isTypeOnly));
      out.push({ specifier: st.moduleSpecifier.text, typeOnly });
    } else if (ts.isImportEqualsDeclaration(st) && ts.isExternalModuleReference(st.moduleReference)) {
      const e = st.moduleReference.expression;
      if (ts.isStringLiteral(e)) out.push({ specifier: e.text, typeOnly: st.isTypeOnly });
    }
  }
  // `import('./x.js')` anywhere in the file (a lazily loaded module is still a dependency), and
  // `import('./x.js').T` in a type. Walking the whole tree is the slow part: only when needed.
  if (!text.includes('import(')) return out;
  const visit = (/** @type {ts.Node} */ node) => {
    if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      const [arg] = node.arguments;
      if (arg && ts.isStringLiteralLike(arg)) out.push({ specifier: arg.text, typeOnly: false });
    }
    if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument) && ts.isStringLiteral(node.argument.literal)) {
      out.push({ specifier: node.argument.literal.text, typeOnly: true });
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

/** The repository-relative .ts file a relative specifier names ('' when there is none). */
export function resolveSpecifier(/** @type {string} */ from, /** @type {string} */ specifier, root = ROOT) {
  const base = path.posix.join(path.posix.dirname(from), specifier);
  const candidates = base.endsWith('.js') ? [base.slice(0, -3) + '.ts'] : [base, `${base}.ts`, `${base}/index.ts`];
  return candidates.find((c) => existsSync(path.join(root, c))) ?? '';
}

/** The import graph of src/: one edge per relative import (packages and node: are left out). */
export function importGraph(root = ROOT) {
  /** @type {Edge[]} */
  const edges = [];
  for (const from of sourceFiles(root)) {
    for (const { specifier, typeOnly } of importsOf(from, readFileSync(path.join(root, from), 'utf8'))) {
      if (!specifier.startsWith('.')) continue;
      edges.push({ from, to: resolveSpecifier(from, specifier, root), specifier, typeOnly });
    }
  }
  return edges;
}

// --- the check ----------------------------------------------------------------------------

/** The layer and unit of a file, or undefined when no layer holds it. */
export function placeOf(/** @type {string} */ file, layers = LAYERS) {
  /** @type {{ layer: Layer, unit: string }[]} */
  const found = [];
  for (const layer of layers) {
    for (const p of layer.paths) {
      const unit = unitFor(file, p);
      if (unit !== undefined) found.push({ layer, unit });
    }
  }
  if (found.length > 1) throw new Error(`${file} is in more than one layer: ${found.map((f) => f.layer.name).join(', ')}`);
  return found[0];
}

/** The unit `file` belongs to under one path pattern, or undefined when the pattern misses it. */
function unitFor(/** @type {string} */ file, /** @type {string} */ pattern) {
  if (pattern.endsWith('/*/')) {
    const dir = pattern.slice(0, -2);
    const rest = file.startsWith(dir) ? file.slice(dir.length) : '';
    const slash = rest.indexOf('/');
    return slash > 0 ? dir + rest.slice(0, slash + 1) : undefined;
  }
  if (pattern.endsWith('/*.ts')) {
    const dir = pattern.slice(0, -4);
    return file.startsWith(dir) && !file.slice(dir.length).includes('/') && file.endsWith('.ts') ? dir : undefined;
  }
  if (pattern.endsWith('/')) return file.startsWith(pattern) ? pattern : undefined;
  return file === pattern ? pattern : undefined;
}

/**
 * @typedef {{ from: string, to: string, rule: string, units?: string[] }} Violation
 *   A cycle has its path in `from`, its first unit again in `to` and its units in `units`.
 */

/**
 * The violations of the layering in `edges`: imports between layers that the table does not
 * allow, files in no layer, imports that leave src/ or name no file, and import cycles.
 * @returns {Violation[]}
 */
export function violations(/** @type {Edge[]} */ edges, layers = LAYERS) {
  /** @type {Violation[]} */
  const out = [];
  const files = new Set(edges.map((e) => e.from));
  for (const f of files) if (!placeOf(f, layers)) out.push({ from: f, to: '', rule: 'in no layer: add its folder to LAYERS' });
  for (const e of edges) {
    if (e.to === '') {
      out.push({ from: e.from, to: e.specifier, rule: 'names no file' });
      continue;
    }
    if (!e.to.startsWith('src/')) {
      out.push({ from: e.from, to: e.to, rule: 'src/ imports only src/' });
      continue;
    }
    const a = placeOf(e.from, layers);
    const b = placeOf(e.to, layers);
    if (!a || !b || a.unit === b.unit || a.layer.mayImport.includes(b.layer.name)) continue;
    const rule =
      a.layer === b.layer
        ? `a ${a.layer.name} never imports another ${a.layer.name}`
        : `${a.layer.name} may not import ${b.layer.name}; it may import ${a.layer.mayImport.join(', ') || 'nothing in src/'}`;
    out.push({ from: e.from, to: e.to, rule });
  }
  // Between units, any cycle (also type-only): the arrows of a layering point one way.
  /** @type {string[][]} */
  const unitEdges = [];
  for (const e of edges) {
    const a = e.to && placeOf(e.from, layers);
    const b = e.to && placeOf(e.to, layers);
    if (a && b && a.unit !== b.unit) unitEdges.push([a.unit, b.unit]);
  }
  for (const cycle of cycles(unitEdges)) {
    out.push({ from: cycle.join(' → '), to: cycle[0] ?? '', rule: 'cycle between folders', units: [...cycle].sort() });
  }
  // Between files, a cycle of value imports: module evaluation order then decides what is
  // still undefined when a file runs. Type-only imports are erased and cannot cycle at run time.
  const valueEdges = edges.filter((e) => e.to && !e.typeOnly).map((e) => [e.from, e.to]);
  for (const cycle of cycles(valueEdges)) out.push({ from: cycle.join(' → '), to: cycle[0] ?? '', rule: 'cycle of value imports' });
  return out;
}

/**
 * One cycle per strongly connected component with more than one node (Tarjan), as a path
 * that starts at the component's first node in sort order and returns to it (the last node
 * is left implicit: `[a, b, c]` reads a → b → c → a).
 */
export function cycles(/** @type {string[][]} */ pairs) {
  /** @type {Map<string, string[]>} */
  const next = new Map();
  for (const [a, b] of pairs) {
    if (a === undefined || b === undefined || a === b) continue;
    if (!next.has(a)) next.set(a, []);
    if (!next.has(b)) next.set(b, []);
    const list = next.get(a) ?? [];
    if (!list.includes(b)) list.push(b);
  }
  for (const list of next.values()) list.sort();
  /** @type {Map<string, number>} */ const index = new Map();
  /** @type {Map<string, number>} */ const low = new Map();
  /** @type {string[]} */ const stack = [];
  const onStack = new Set();
  /** @type {string[][]} */ const out = [];
  let counter = 0;
  const visit = (/** @type {string} */ v) => {
    index.set(v, counter);
    low.set(v, counter);
    counter++;
    stack.push(v);
    onStack.add(v);
    for (const w of next.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) ?? 0, low.get(w) ?? 0));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v) ?? 0, index.get(w) ?? 0));
    }
    if (low.get(v) === index.get(v)) {
      /** @type {Set<string>} */
      const scc = new Set();
      let w;
      do {
        w = stack.pop();
        if (w === undefined) break;
        onStack.delete(w);
        scc.add(w);
      } while (w !== v);
      if (scc.size > 1) out.push(shortestLoop([...scc].sort(), scc, next));
    }
  };
  for (const v of [...next.keys()].sort()) if (!index.has(v)) visit(v);
  return out.sort((x, y) => (x[0] ?? '').localeCompare(y[0] ?? ''));
}

/** The shortest path from `start[0]` back to itself inside one component (breadth first). */
function shortestLoop(/** @type {string[]} */ sorted, /** @type {Set<string>} */ scc, /** @type {Map<string, string[]>} */ next) {
  const start = sorted[0] ?? '';
  /** @type {Map<string, string>} */
  const parent = new Map();
  const queue = [start];
  while (queue.length > 0) {
    const v = queue.shift() ?? '';
    for (const w of next.get(v) ?? []) {
      if (!scc.has(w)) continue;
      if (w === start) {
        const loop = [v];
        while (loop[0] !== start) loop.unshift(parent.get(loop[0] ?? '') ?? start);
        return loop;
      }
      if (!parent.has(w)) {
        parent.set(w, v);
        queue.push(w);
      }
    }
  }
  return sorted;
}

/**
 * The check as the test and the script run it: the violations not listed as known, and the
 * known entries that no longer match anything (to be deleted).
 */
export function check(edges = importGraph(), layers = LAYERS, known = KNOWN_VIOLATIONS, knownCycles = KNOWN_CYCLES) {
  const all = violations(edges, layers);
  const sameUnits = (/** @type {string[]} */ a, /** @type {string[] | undefined} */ b) =>
    b !== undefined && [...a].sort().join() === b.join();
  const isKnownCycle = (/** @type {Violation} */ v) => knownCycles.some((k) => sameUnits(k.units, v.units));
  const matches = (/** @type {{ from: string, to: string }} */ k, /** @type {{ from: string, to: string }} */ v) =>
    k.from === v.from && (k.to === v.to || k.to === '*');
  const isKnown = (/** @type {{ from: string, to: string }} */ v) => known.some((k) => matches(k, v));
  return {
    violations: all.filter((v) => !isKnown(v) && !isKnownCycle(v)),
    stale: [
      ...known.filter((k) => !all.some((v) => matches(k, v))).map((k) => `${k.from} → ${k.to}`),
      ...knownCycles.filter((k) => !all.some((v) => sameUnits(k.units, v.units))).map((k) => `cycle ${k.units.join(', ')}`),
    ],
  };
}

/** One line per violation: `from → to (rule)`. */
export function formatViolation(/** @type {{ from: string, to: string, rule: string }} */ v) {
  return v.to === '' ? `${v.from} (${v.rule})` : `${v.from} → ${v.to} (${v.rule})`;
}

// --- the README table ---------------------------------------------------------------------

export const README_BEGIN = '<!-- layers: generated by `node scripts/layering.mjs --write-readme` from LAYERS -->';
export const README_END = '<!-- /layers -->';

/** The README's Structure table, rendered from the layer table. */
export function renderTable(layers = LAYERS) {
  const names = layers.map((l) => l.name);
  const lines = ['| layer | folders | holds | may import |', '|---|---|---|---|'];
  for (const l of layers) {
    const others = names.filter((n) => n !== l.name && !l.mayImport.includes(n));
    const below = l.mayImport.filter((n) => n !== l.name);
    let may;
    if (below.length === 0) may = l.mayImport.includes(l.name) ? 'each other only' : 'nothing in `src/`';
    else if (others.length === 0) may = 'anything';
    else if (others.length <= 2 && below.length > others.length) may = `anything but ${others.join(' and ')}`;
    else {
      may = below.join(', ');
      if (l.mayImport.includes(l.name)) may = `each other, ${may}`;
      else if (l.paths.some((p) => p.endsWith('/*/'))) may += `; never another ${l.name}`;
    }
    const folders = l.paths.map((p) => `\`${p.replace(/\*\/$/, '<name>/')}\``).join(' ');
    lines.push(`| ${l.name} | ${folders} | ${l.holds} | ${may} |`);
  }
  return lines.join('\n');
}

/** The table between the README markers, or undefined when the markers are missing. */
export function readmeTable(text = readFileSync(path.join(ROOT, 'README.md'), 'utf8')) {
  const begin = text.indexOf(README_BEGIN);
  const end = text.indexOf(README_END);
  if (begin === -1 || end < begin) return undefined;
  return text.slice(begin + README_BEGIN.length, end).trim();
}

// --- command line -------------------------------------------------------------------------

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  if (process.argv.includes('--write-readme')) {
    const file = path.join(ROOT, 'README.md');
    const text = readFileSync(file, 'utf8');
    const begin = text.indexOf(README_BEGIN);
    const end = text.indexOf(README_END);
    if (begin === -1 || end < begin) {
      process.stderr.write(`layering: README.md has no ${README_BEGIN} … ${README_END} block\n`);
      process.exit(1);
    }
    writeFileSync(file, `${text.slice(0, begin + README_BEGIN.length)}\n${renderTable()}\n${text.slice(end)}`);
    process.stdout.write('layering: README.md table rewritten\n');
  } else {
    const { violations: found, stale } = check();
    for (const v of found) process.stdout.write(`${formatViolation(v)}\n`);
    for (const s of stale) process.stdout.write(`${s} (listed as known but no longer found: delete it)\n`);
    if (readmeTable() !== renderTable()) process.stdout.write('README.md Structure table differs from LAYERS (run with --write-readme)\n');
    const failed = found.length + stale.length > 0 || readmeTable() !== renderTable();
    process.stdout.write(failed ? '' : `layering: ${sourceFiles().length} files, no violations\n`);
    process.exit(failed ? 1 : 0);
  }
}
