// `dstack-proxy apply`: PUT the document, then poll GET /api/v1/status until every loop and
// object reports Ready for the new generation (exit 0), something fails (exit 1, listing it),
// or --timeout passes (exit 1, naming what is not ready). Each object is printed as it becomes
// Ready; the loops' counts are a line per change, or one line redrawn in place on a terminal.

import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { detectFormat } from '../spec/index.js';
import { CLIENT_HELP, CLIENT_OPTIONS, openClient, withClient, type Client } from './client.js';
import type { Command, Io } from './command.js';
import { UsageError } from './command.js';
import { paint, parseDuration } from './format.js';
import { readDocumentArg } from './read-input.js';
import { assess, progressLine } from './status.js';

export interface ApplyDeps {
  /** Between two status polls; default 250 ms. */
  pollIntervalMs?: number;
  now?: () => number;
}

const DEFAULT_TIMEOUT = '120s';

export function createApplyCommand(deps: ApplyDeps = {}): Command {
  const pollIntervalMs = deps.pollIntervalMs ?? 250;
  const now = deps.now ?? Date.now;
  return {
    name: 'apply',
    summary: 'apply a document to a running gateway and wait until it converges',
    help: `Usage: dstack-proxy apply -f FILE [--url URL] [--token-file FILE] [--timeout 120s] [--if-match N]

Send the document to a running gateway (PUT /api/v1/state), then wait until every reconcile
loop and every object it reports is Ready for the new generation. Each object the loops act
on is printed as it becomes Ready, with the time since the apply; the loops' counts follow as a
line per change, or on a terminal as one line redrawn in place. A document equal to the current
one changes nothing.

Options:
  -f, --file FILE     the document (YAML or JSON); - reads standard input
${CLIENT_HELP}
  --timeout DURATION  how long to wait for convergence: 90s, 2m, 500ms (default: ${DEFAULT_TIMEOUT})
  --if-match N        apply only if the gateway is at generation N (else 409, nothing changes)
  --no-wait           return once the document is stored
  -h, --help          show this help

Exit codes: 0 applied and converged (or no changes), 1 rejected, failed or timed out, 2 usage error.`,
    async run(argv, io) {
      const { values } = parseArgs({
        args: argv,
        options: {
          file: { type: 'string', short: 'f' },
          ...CLIENT_OPTIONS,
          timeout: { type: 'string', default: DEFAULT_TIMEOUT },
          'if-match': { type: 'string' },
          'no-wait': { type: 'boolean' },
        },
        strict: true,
      });
      const timeoutMs = parseDuration(values.timeout);
      if (timeoutMs === null)
        throw new UsageError(`--timeout must be a duration like 120s, 2m or 500ms; got ${JSON.stringify(values.timeout)}`);
      let ifMatch: number | undefined;
      if (values['if-match'] !== undefined) {
        if (!/^\d{1,15}$/.test(values['if-match']))
          throw new UsageError(`--if-match must be a generation number; got ${JSON.stringify(values['if-match'])}`);
        ifMatch = Number(values['if-match']);
      }
      const doc = await readDocumentArg(values.file, io);
      const client = await openClient(values, io);
      return withClient('apply', client, io, async (c) => {
        const res = await c.putState(doc.text, {
          yaml: detectFormat(doc.text, doc.name) === 'yaml',
          dryRun: false,
          ...(ifMatch === undefined ? {} : { ifMatch }),
        });
        if (!res.changed) {
          io.stdout(`no changes (generation ${res.generation})\n`);
          return 0;
        }
        const d = res.plan.document;
        io.stdout(`applied generation ${res.generation}: ${d.added} added, ${d.changed} changed, ${d.removed} removed\n`);
        if (values['no-wait']) return 0;
        return await waitForConvergence(c, res.generation, timeoutMs, io, { pollIntervalMs, now });
      });
    },
  };
}

export const applyCommand = createApplyCommand();

/** Object lines printed per poll at most; the rest are counted in one line. */
const OBJECT_LINES_PER_POLL = 20;

/**
 * Poll status until converged (0), failed (1) or timed out (1). Each object the loops act on is
 * printed once it is Ready, with the time since the apply; a line per loop when its count
 * changes. On a terminal, the loops' counts are one line redrawn in place under those.
 */
export async function waitForConvergence(
  client: Pick<Client, 'status'>,
  generation: number,
  timeoutMs: number,
  io: Io,
  opts: { pollIntervalMs: number; now: () => number },
): Promise<number> {
  const p = paint(io);
  const started = opts.now();
  const deadline = started + timeoutMs;
  const shown = new Map<string, string>();
  const seen = new Set<string>();
  /** On a terminal: the progress line is on screen, to be cleared before anything else is printed. */
  let drawn = false;
  const print = (write: (s: string) => void, text: string): void => {
    if (drawn) io.stdout(CLEAR_LINE);
    drawn = false;
    write(text);
  };
  const seconds = (): string => `${((opts.now() - started) / 1000).toFixed(1)}s`;
  for (;;) {
    const a = assess(await client.status(), generation);
    let printed = 0;
    let more = 0;
    for (const loop of a.loops) {
      for (const key of loop.readyNow) {
        const id = `${loop.loop} ${key}`;
        if (seen.has(id)) continue;
        seen.add(id);
        if (printed++ < OBJECT_LINES_PER_POLL) print(io.stdout, `  ${p.green('ready')} ${id} (${seconds()})\n`);
        else more++;
      }
    }
    if (more > 0) print(io.stdout, `  ${p.green('ready')} ${more} more objects (${seconds()})\n`);
    if (io.isTTY) {
      const counts = a.loops.map((l) => `${l.loop} ${l.ready}/${l.total}`).join(', ');
      io.stdout(`${drawn ? CLEAR_LINE : ''}generation ${generation}: ${counts} ready (${seconds()})`);
      drawn = true;
    } else {
      for (const loop of a.loops) {
        const line = progressLine(loop, generation);
        if (shown.get(loop.loop) !== line) {
          shown.set(loop.loop, line);
          io.stdout(`${line}\n`);
        }
      }
    }
    if (a.failures.length > 0) {
      print(io.stderr, `${p.red(`generation ${generation} failed to converge`)}:\n${a.failures.map((f) => `  ${f}\n`).join('')}`);
      return 1;
    }
    const elapsed = opts.now() - started;
    if (a.converged) {
      print(io.stdout, `${p.green('converged')}: generation ${generation} in ${(elapsed / 1000).toFixed(1)}s\n`);
      return 0;
    }
    if (opts.now() >= deadline) {
      print(
        io.stderr,
        `timed out after ${(timeoutMs / 1000).toFixed(1)}s waiting for generation ${generation}; not ready:\n${a.pending.map((f) => `  ${f}\n`).join('')}`,
      );
      return 1;
    }
    await sleep(Math.min(opts.pollIntervalMs, Math.max(0, deadline - opts.now())));
  }
}

/** Back to the start of the line, and erase it. */
const CLEAR_LINE = '\r\x1b[2K';
