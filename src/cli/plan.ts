// `dstack-proxy plan`: PUT the document with ?dryRun=true and print what would change — the
// document's objects (secrets only as <redacted>), then per loop the actions and the Nginx
// diffs. Exit codes as terraform's -detailed-exitcode: 0 no changes, 2 changes, 1 error.

import { parseArgs } from 'node:util';
import type { Plan } from '../api/runtime.js';
import { detectFormat, type ObjectChange } from '../spec/index.js';
import { CLIENT_HELP, CLIENT_OPTIONS, openClient, withClient, type PutStateResponse } from './client.js';
import type { Command, Io } from './command.js';
import { UsageError } from './command.js';
import { colourDiff, paint, plural, showValue, type Paint } from './format.js';
import { readDocumentArg } from './read-input.js';

export const EXIT_CHANGES = 2;

export const planCommand: Command = {
  name: 'plan',
  summary: 'show what applying a document to a running gateway would change',
  help: `Usage: dstack-proxy plan -f FILE [--url URL] [--token-file FILE]

Send the document to a running gateway as a dry run (PUT /api/v1/state?dryRun=true) and show
what would change: the document's objects (secrets only as <redacted>), then per reconcile
loop the actions, with unified diffs of the Nginx files. Nothing is changed.

Options:
  -f, --file FILE     the document (YAML or JSON); - reads standard input
${CLIENT_HELP}
  -h, --help          show this help

Colour on a terminal unless NO_COLOR is set.
Exit codes: 0 no changes, 2 changes, 1 error (invalid document, gateway unreachable, bad usage).`,
  async run(argv, io) {
    let values: { file?: string | undefined; url?: string | undefined; 'token-file'?: string | undefined };
    let doc: { text: string; name?: string };
    try {
      ({ values } = parseArgs({ args: argv, options: { file: { type: 'string', short: 'f' }, ...CLIENT_OPTIONS }, strict: true }));
      doc = await readDocumentArg(values.file, io);
    } catch (err) {
      // Exit 2 means "changes" here, so usage errors exit 1.
      io.stderr(`dstack-proxy plan: ${(err as Error).message}\n`);
      return 1;
    }
    let client;
    try {
      client = await openClient(values, io);
    } catch (err) {
      if (!(err instanceof UsageError)) throw err;
      io.stderr(`dstack-proxy plan: ${err.message}\n`);
      return 1;
    }
    return withClient('plan', client, io, async (c) => {
      const res = await c.putState(doc.text, { yaml: detectFormat(doc.text, doc.name) === 'yaml', dryRun: true });
      io.stdout(renderPlan(res, io));
      return hasChanges(res.plan) ? EXIT_CHANGES : 0;
    });
  },
};

/** Document changes, or any loop action (drift, a foreign file in the way) count as changes. */
export function hasChanges(plan: Plan): boolean {
  return plan.document.changes.length > 0 || Object.values(plan.loops).some((l) => l.actions.length > 0);
}

export function renderPlan(res: PutStateResponse, io: Io): string {
  const p = paint(io);
  const { document, loops } = res.plan;
  const out: string[] = [];
  if (!hasChanges(res.plan)) {
    out.push(`No changes: the gateway already matches this document (generation ${res.generation}).`);
    return `${out.join('\n')}\n`;
  }

  out.push(p.bold(`Document (generation ${res.generation} → ${document.changes.length > 0 ? res.generation + 1 : res.generation}):`));
  if (document.changes.length === 0) out.push('  no changes to the document');
  for (const c of document.changes) out.push(...changeLines(c, p));
  out.push(`  ${document.added} to add, ${document.changed} to change, ${document.removed} to remove`);

  for (const [name, loop] of Object.entries(loops)) {
    out.push(
      '',
      p.bold(`${name}: ${loop.actions.length === 0 ? 'nothing to do' : plural(loop.actions.length, 'action')}${notes(loop.notes)}`),
    );
    for (const a of loop.actions) {
      out.push(`  ${symbol(a.kind, p)} ${a.summary}`);
      if (a.diff)
        out.push(
          ...colourDiff(a.diff.replace(/\n$/, ''), p)
            .split('\n')
            .map((l) => `    ${l}`),
        );
    }
  }
  return `${out.join('\n')}\n`;
}

function changeLines(c: ObjectChange, p: Paint): string[] {
  const head = `  ${symbol(c.op, p)} ${c.kind} ${c.key}`;
  const lines = [c.op === 'added' ? p.green(head) : c.op === 'removed' ? p.red(head) : p.yellow(head)];
  for (const f of c.fields ?? []) {
    const value = f.secret
      ? '<redacted> (changed)'
      : f.old === undefined
        ? `${showValue(f.new)} (added)`
        : f.new === undefined
          ? `${showValue(f.old)} (removed)`
          : `${showValue(f.old)} → ${showValue(f.new)}`;
    lines.push(`      ${f.field}: ${value}`);
  }
  return lines;
}

function symbol(kind: string, p: Paint): string {
  switch (kind) {
    case 'added':
    case 'create':
      return p.green('+');
    case 'removed':
    case 'delete':
      return p.red('-');
    case 'conflict':
      return p.red('!');
    default:
      return p.yellow('~');
  }
}

function notes(n: Record<string, unknown> | undefined): string {
  if (!n) return '';
  const parts = Object.entries(n)
    .filter(([, v]) => v !== false && v !== undefined && v !== null)
    .map(([k, v]) => (v === true ? k : `${k}: ${String(v)}`));
  return parts.length > 0 ? ` (${parts.join(', ')})` : '';
}
