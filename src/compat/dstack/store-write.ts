// The one write path of the dstack compatibility routes: read the stored document, apply one
// pure change, validate the candidate exactly as PUT /api/v1/state does, and write it with
// If-Match on the generation read. A PUT from an operator that lands in between makes the write
// fail with DP_ERR_GENERATION_MISMATCH: the change is applied again to what is stored then.
// Compat calls run one at a time (as dstack's registry lock does), so they never race each
// other; waits for loop status happen after the write, outside this queue.

import type { Logger } from 'pino';
import { validateDocument } from '../../api/state-routes.js';
import { ProxyError } from '../../errors.js';
import type { ProxyState, SpecIssue } from '../../spec/index.js';
import type { StateStore, StoredState } from '../../state/store.js';
import type { Outcome } from './mapper.js';

/** How often a write that lost the race to another writer is tried again. */
export const MAX_WRITE_ATTEMPTS = 10;

export type WriteAnswer =
  /**
   * Stored (`changed`) or already so (`same`); `generation` is the one that says it, `state`
   * that document, `previous` the one the change was applied to.
   */
  | { kind: 'written'; changed: boolean; generation: number; state: ProxyState; previous: ProxyState }
  /** An expected refusal: dstack's text, or `<path>: <message>` of a document error. */
  | { kind: 'refused'; detail: string };

/** A change: the stored document in, an Outcome out (pure; it may run again on a newer document). */
export type Change = (current: StoredState) => Outcome;

export interface CompatWriter {
  /** Applies `change` through the queue; `what` names the call in logs (never a secret). */
  write(change: Change, what: Record<string, string>): Promise<WriteAnswer>;
}

export function compatWriter(store: StateStore, logger: Logger): CompatWriter {
  let queue: Promise<unknown> = Promise.resolve();
  const once = async (change: Change, what: Record<string, string>): Promise<WriteAnswer> => {
    for (let attempt = 1; ; attempt++) {
      const current = await store.read();
      const outcome = change(current);
      if (outcome.kind === 'refused') return { kind: 'refused', detail: outcome.detail };
      if (outcome.kind === 'same')
        return { kind: 'written', changed: false, generation: current.generation, state: current.state, previous: current.state };
      let next: ProxyState;
      try {
        next = validateDocument(outcome.state);
      } catch (err) {
        const issue = documentIssue(err);
        if (issue === undefined) throw err;
        logger.info({ ...what, path: issue.path }, 'dstack call refused: the document would be invalid');
        return { kind: 'refused', detail: issue.path ? `${issue.path}: ${issue.message}` : issue.message };
      }
      try {
        const r = await store.write(next, { ifMatch: current.generation });
        if (r.changed) logger.info({ ...what, generation: r.generation }, 'dstack call stored a new generation');
        return { kind: 'written', changed: r.changed, generation: r.generation, state: r.state, previous: current.state };
      } catch (err) {
        if (!(err instanceof ProxyError && err.code === 'DP_ERR_GENERATION_MISMATCH') || attempt >= MAX_WRITE_ATTEMPTS) throw err;
        logger.debug({ ...what, attempt }, 'another writer stored a generation first; applying the call again');
      }
    }
  };
  return {
    write(change, what) {
      const run = queue.then(() => once(change, what));
      queue = run.catch(() => undefined);
      return run;
    },
  };
}

function documentIssue(err: unknown): SpecIssue | undefined {
  if (!(err instanceof ProxyError) || err.code !== 'DP_ERR_INVALID_DOCUMENT') return undefined;
  const errors = err.details?.errors as SpecIssue[] | undefined;
  return errors?.[0] ?? { path: '', message: err.message };
}
