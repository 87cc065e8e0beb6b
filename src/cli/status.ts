// `dstack-proxy status`: what the gateway's loops report, as a table (or the raw JSON), and
// assess(): is the gateway converged to a generation, still working, or failing? apply.ts
// polls with the same function.

import { parseArgs } from 'node:util';
import type { Condition } from '../reconcilers/conditions.js';
import type { LoopStatus } from '../reconcilers/types.js';
import { CLIENT_HELP, CLIENT_OPTIONS, openClient, withClient, type StatusResponse } from './client.js';
import type { Command, Io } from './command.js';
import { age, paint, table } from './format.js';

export interface LoopProgress {
  loop: string;
  /** Objects whose Ready is True for the generation. */
  ready: number;
  /** Objects that report a Ready condition. */
  total: number;
  /** The loop finished a pass at the generation (or a later one). */
  current: boolean;
  /** Objects the loop acted on at the generation (or later) that are Ready: the converging ones. */
  readyNow: string[];
}

export interface Assessment {
  converged: boolean;
  /** One line per failure: a failing loop, action key or object. Non-empty = failed. */
  failures: string[];
  /** One line per thing not ready yet (empty when converged). */
  pending: string[];
  loops: LoopProgress[];
}

// A Ready=False whose reason says something went wrong (not "still working on it").
const FAILURE_REASON = /fail|error|reject|conflict|invalid|denied|unreachable/i;

/**
 * Where the gateway stands relative to `generation`. A condition counts only when its
 * observedGeneration is at least `generation`; an object a loop did not touch keeps its older
 * observedGeneration, so it counts as current once its loop finished a Ready pass at
 * `generation`. Failures listed by a loop count only once that loop has passed at `generation`.
 */
export function assess(s: StatusResponse, generation: number): Assessment {
  const failures: string[] = [];
  const pending: string[] = [];
  const loops: LoopProgress[] = [];
  if (!s.ready) pending.push('the gateway has not finished its first reconcile pass');
  if (s.observedGeneration < generation)
    pending.push(`the controller has not picked up generation ${generation} yet (at ${s.observedGeneration})`);

  for (const [name, loop] of Object.entries(s.loops)) {
    const ready = find(loop.conditions, 'Ready');
    const current = ready !== undefined && atLeast(ready, generation);
    const loopOk = current && ready.status === 'True';
    const failing = current ? Object.entries(loop.failures) : [];
    const reported = new Set(failing.map(([, f]) => f.message));
    // The loop's own Ready=False message summarises its failing keys: list the keys instead.
    if (current && ready.status === 'False' && failing.length === 0) failures.push(`${name}: ${ready.reason}: ${ready.message}`);
    for (const [key, f] of failing) {
      failures.push(`${name} ${key}: ${f.message} (${f.terminal ? 'not retried until the next generation' : `attempt ${f.attempts}`})`);
    }
    if (!current) {
      pending.push(`${name}: has not finished a pass at generation ${generation}`);
    }

    let readyCount = 0;
    let total = 0;
    const readyNow: string[] = [];
    for (const [key, { conditions }] of Object.entries(loop.objects)) {
      const r = find(conditions, 'Ready');
      if (r === undefined) continue;
      total++;
      const d = find(conditions, 'Degraded');
      const degraded = d !== undefined && d.status === 'True' && atLeast(d, generation);
      const failedNow = r.status === 'False' && atLeast(r, generation) && FAILURE_REASON.test(r.reason);
      if (degraded || failedNow) {
        const c = failedNow ? r : d!;
        if (!reported.has(c.message)) failures.push(`${name} ${key}: ${c.reason}: ${c.message}`);
      } else if (r.status === 'True' && (atLeast(r, generation) || loopOk)) {
        readyCount++;
        if (atLeast(r, generation)) readyNow.push(key);
      } else if (current || r.status !== 'True') {
        pending.push(`${name} ${key}: Ready=${r.status}${r.reason ? ` (${r.reason}${r.message ? `: ${r.message}` : ''})` : ''}`);
      }
    }
    loops.push({ loop: name, ready: readyCount, total, current, readyNow });
  }
  const converged = failures.length === 0 && pending.length === 0 && loops.every((l) => l.ready === l.total);
  return { converged, failures, pending, loops };
}

/** `nginx: 3/5 objects ready` (+ what it waits for). */
export function progressLine(p: LoopProgress, generation: number): string {
  return `${p.loop}: ${p.ready}/${p.total} objects ready${p.current ? '' : ` (waiting for a pass at generation ${generation})`}`;
}

export function createStatusCommand(deps: { now?: () => number } = {}): Command {
  const now = deps.now ?? Date.now;
  return {
    name: 'status',
    summary: 'show what a running gateway reports, per loop and object',
    help: `Usage: dstack-proxy status [--url URL] [--token-file FILE] [--json] [--wide]

Show the conditions of every object (sites, certificates, tunnels) per reconcile loop of a
running gateway, the current generation, and whether the gateway has converged to it.
Replicas also show their requests: IN-FLIGHT now and REQUESTS sent so far.

Options:
${CLIENT_HELP}
  --json              print the raw JSON of GET /api/v1/status
  --wide              do not shorten messages
  -h, --help          show this help

Exit codes: 0 the status was read (converged or not), 1 error, 2 usage error.`,
    async run(argv, io) {
      const { values } = parseArgs({
        args: argv,
        options: { ...CLIENT_OPTIONS, json: { type: 'boolean' }, wide: { type: 'boolean' } },
        strict: true,
      });
      const client = await openClient(values, io);
      return withClient('status', client, io, async (c) => {
        const s = await c.status();
        if (values.json) io.stdout(`${JSON.stringify(s, null, 2)}\n`);
        else io.stdout(renderStatus(s, io, { now: now(), wide: values.wide === true }));
        return 0;
      });
    },
  };
}

export const statusCommand = createStatusCommand();

/** The human view of a status response. */
export function renderStatus(s: StatusResponse, io: Io, opts: { now: number; wide: boolean }): string {
  const p = paint(io);
  const a = assess(s, s.generation);
  const state = a.failures.length > 0 ? p.red('failing') : a.converged ? p.green('converged') : p.yellow('converging');
  const lines = [`generation ${s.generation} (observed ${s.observedGeneration}, hash ${s.hash.slice(0, 12)}): ${state}`];
  const rows: string[][] = [];
  for (const [name, loop] of Object.entries(s.loops)) rows.push(...loopRows(name, loop, opts));
  // Replicas' requests (in flight now, sent so far), from daemons that report them.
  const loads = rows.some((r) => r.length > 6);
  const header = ['LOOP', 'OBJECT', 'READY', 'REASON', 'MESSAGE', 'AGE', ...(loads ? ['IN-FLIGHT', 'REQUESTS'] : [])];
  if (rows.length > 0) lines.push('', table(header, rows));
  else lines.push('', 'no loops report status yet');
  if (a.failures.length > 0) lines.push('', 'Failing:', ...a.failures.map((f) => `  ${p.red(f)}`));
  if (!a.converged && a.failures.length === 0 && a.pending.length > 0) lines.push('', 'Not ready:', ...a.pending.map((f) => `  ${f}`));
  return `${lines.join('\n')}\n`;
}

function loopRows(name: string, loop: LoopStatus, opts: { now: number; wide: boolean }): string[][] {
  const row = (object: string, c: Condition | undefined): string[] => [
    name,
    object,
    c?.status ?? '-',
    c?.reason || '-',
    c ? shorten(c.message, opts.wide) || '-' : '-',
    c?.lastTransitionTime ? age(opts.now - Date.parse(String(c.lastTransitionTime))) : '-',
  ];
  const rows = [row('(loop)', find(loop.conditions, 'Ready'))];
  for (const [key, object] of Object.entries(loop.objects)) {
    const { conditions } = object;
    if (conditions.length === 0) continue; // outputs only (a service's socket): for machines
    const ready = find(conditions, 'Ready');
    const degraded = find(conditions, 'Degraded');
    // Serving an old version while the new one is rejected: show why, not just "True".
    const r = row(
      key,
      degraded?.status === 'True' && ready?.status === 'True'
        ? { ...degraded, status: 'True', reason: `${ready.reason}/${degraded.reason}` }
        : ready,
    );
    const load = loadOf(object);
    if (load !== null) r.push(String(load.inFlight), String(load.requests));
    rows.push(r);
  }
  return rows;
}

/** A replica's `load` ({inFlight, requests}, read live by the daemon), when the object has one. */
function loadOf(object: object): { inFlight: number; requests: number } | null {
  const load = (object as { load?: unknown }).load;
  if (typeof load !== 'object' || load === null) return null;
  const { inFlight, requests } = load as { inFlight?: unknown; requests?: unknown };
  return typeof inFlight === 'number' && typeof requests === 'number' ? { inFlight, requests } : null;
}

function find(conditions: readonly Condition[], type: string): Condition | undefined {
  return conditions.find((c) => c.type === type);
}

function atLeast(c: Condition, generation: number): boolean {
  return (c.observedGeneration ?? 0) >= generation;
}

function shorten(message: string, wide: boolean): string {
  const one = message.replace(/\s+/g, ' ').trim();
  return wide || one.length <= 80 ? one : `${one.slice(0, 77)}...`;
}
