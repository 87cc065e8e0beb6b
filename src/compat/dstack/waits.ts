// What a dstack call waits for after its write: the loops' status, never a guess. dstack's
// server takes a 200 for "traffic can flow" (a registered replica) and a 400 for "give up on
// this gateway"; so replicas/register answers once the replica's SSH tunnel is Ready at the
// generation written, and an https registration once the domain's first certificate attempt
// has an outcome. Every wait is bounded, ends when the daemon closes, and holds no lock: the
// write queue moves on while a call waits.

import type { Clock } from '../../clock.js';
import type { Condition } from '../../reconcilers/conditions.js';
import { findCondition } from '../../reconcilers/conditions.js';
import type { StatusListener } from '../../reconcilers/controller.js';
import { certificateOutputs, NGINX_LOOP, replicaObjectKey, SSH_LOOP, TLS_LOOP } from '../../reconcilers/outputs.js';
import type { LoopStatus, StatusSnapshot } from '../../reconcilers/types.js';

/** What the waits read: the controller's status and its change feed. */
export interface StatusSource {
  statuses(): StatusSnapshot;
  onStatus(listener: StatusListener): () => void;
}

export type Verdict = { kind: 'ready' } | { kind: 'failed'; reason: string };

export type WaitResult = Verdict | { kind: 'closed' };

/** What a check reads: some loops' statuses (all of them, or just the one that changed). */
export type LoopsView = { loops: Readonly<Record<string, LoopStatus>> };

/**
 * Resolves with the first verdict `check` gives (at once, and after every status change), with
 * `onTimeout()` after `timeoutMs`, or with `closed` when `signal` aborts. A change is checked
 * with the status of the loop that changed alone: no copy of every loop's status per change.
 */
export function waitForStatus(
  source: StatusSource,
  check: (s: LoopsView) => Verdict | undefined,
  o: { timeoutMs: number; onTimeout: (s: StatusSnapshot) => Verdict; signal: AbortSignal; clock: Clock },
): Promise<WaitResult> {
  return new Promise<WaitResult>((resolve) => {
    let done = false;
    const finish = (r: WaitResult): void => {
      if (done) return;
      done = true;
      unsubscribe();
      o.clock.clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
      resolve(r);
    };
    const evaluate = (view: LoopsView): void => {
      if (done) return;
      const v = check(view);
      if (v !== undefined) finish(v);
    };
    const onAbort = (): void => finish({ kind: 'closed' });
    const unsubscribe = source.onStatus((loop, status) => evaluate({ loops: { [loop]: status } }));
    const timer = o.clock.setTimeout(() => finish(o.onTimeout(source.statuses())), o.timeoutMs);
    o.signal.addEventListener('abort', onAbort);
    if (o.signal.aborted) onAbort();
    evaluate(source.statuses());
  });
}

/** Tunnel reasons that retrying will not fix: the answer is known at once. */
const DEFINITIVE_REPLICA_REASONS = new Set(['AuthFailed', 'HostKeyMismatch', 'InvalidConfig']);

function readyOf(s: LoopsView, loop: string, key: string): Condition | undefined {
  const obj = s.loops[loop]?.objects[key];
  return obj ? findCondition(obj.conditions, 'Ready') : undefined;
}

/** The tunnel's own words without its retry schedule, which means nothing to dstack's user. */
function tunnelMessage(c: Condition): string {
  return (c.message ?? '').replace(/; retrying in [\d.]+ s$/, '') || c.reason || 'not ready';
}

/**
 * Whether `ready` speaks for `generation`: written at it or later, or kept from before by a
 * loop that has since finished a pass at it. A loop writes an object's status only when
 * something about the object changes, so an object the new generation left as it was keeps its
 * older observedGeneration.
 */
function currentAt(s: LoopsView, loop: string, ready: Condition, generation: number): boolean {
  if ((ready.observedGeneration ?? -1) >= generation) return true;
  const loopReady = s.loops[loop] ? findCondition(s.loops[loop].conditions, 'Ready') : undefined;
  return (loopReady?.observedGeneration ?? -1) >= generation;
}

/**
 * A replica registered at `generation`: Ready there (the SSH loop held it at that generation
 * or later, and its tunnel and app port answer), or a failure no retry will fix. Connect
 * failures and an unreachable app port keep waiting: the tunnel retries by itself.
 */
export function replicaCheck(serviceKey: string, id: string, generation: number): (s: LoopsView) => Verdict | undefined {
  const key = replicaObjectKey(serviceKey, id);
  return (s) => {
    const ready = readyOf(s, SSH_LOOP, key);
    if (ready === undefined || !currentAt(s, SSH_LOOP, ready, generation)) return undefined;
    if (ready.status === 'True') return { kind: 'ready' };
    if (DEFINITIVE_REPLICA_REASONS.has(ready.reason)) return { kind: 'failed', reason: `${ready.reason}: ${tunnelMessage(ready)}` };
    return undefined;
  };
}

/** After the bounded wait: the tunnel's last words, or that it never reported. */
export function replicaTimeout(serviceKey: string, id: string, waitedS: number): (s: StatusSnapshot) => Verdict {
  const key = replicaObjectKey(serviceKey, id);
  return (s) => {
    const ready = readyOf(s, SSH_LOOP, key);
    const last = ready && ready.status !== 'True' ? `${ready.reason}: ${tunnelMessage(ready)}; ` : '';
    return { kind: 'failed', reason: `${last}not ready within ${waitedS} s` };
  };
}

/**
 * A new site written at `generation`: Nginx serves it (the Nginx loop applied it at that
 * generation or later, and no worker of the configuration before still accepts), or Nginx
 * refused it (no wait will change that; the site's own status says why).
 */
export function siteCheck(domain: string, generation: number): (s: LoopsView) => Verdict | undefined {
  return (s) => {
    const ready = readyOf(s, NGINX_LOOP, domain);
    if (ready === undefined || !currentAt(s, NGINX_LOOP, ready, generation)) return undefined;
    if (ready.status === 'True' && ready.reason === 'Applied') return { kind: 'ready' };
    if (ready.status === 'False') return { kind: 'failed', reason: `${ready.reason}: ${ready.message ?? ''}` };
    return undefined;
  };
}

/** `loop` finished a pass at `generation` or later (whatever its objects' state). */
export function passCheck(loop: string, generation: number): (s: LoopsView) => Verdict | undefined {
  return (s) => {
    const status = s.loops[loop];
    const ready = status ? findCondition(status.conditions, 'Ready') : undefined;
    return (ready?.observedGeneration ?? -1) >= generation ? { kind: 'ready' } : undefined;
  };
}

/** Why a certificate could not be had, as the TLS loop reports it. */
export type CertFailure = { kind: 'dns'; error: string | undefined } | { kind: 'issue'; error: string | undefined } | { kind: 'timeout' };

export type CertVerdict = { kind: 'ready' } | { kind: 'failed'; failure: CertFailure };

/** What the TLS loop's last failed attempt for the domain said, on one line (its typed output). */
function certError(s: LoopsView, domain: string): string | undefined {
  return certificateOutputs(s, domain)?.lastError?.replace(/\s+/g, ' ').trim() || undefined;
}

/**
 * A domain whose https registration was written at `generation`: its certificate is served, or
 * the TLS loop's pass at that generation or later reports that the attempt it knows of failed
 * (the domain does not resolve, or certbot failed).
 */
export function certificateCheck(domain: string, generation: number): (s: LoopsView) => CertVerdict | undefined {
  return (s) => {
    const ready = readyOf(s, TLS_LOOP, domain);
    if (ready === undefined) return undefined;
    if (ready.status === 'True') return { kind: 'ready' };
    if ((ready.observedGeneration ?? -1) < generation) return undefined;
    if (ready.reason === 'DNSNotReady') return { kind: 'failed', failure: { kind: 'dns', error: certError(s, domain) } };
    if (ready.reason === 'IssueFailed') return { kind: 'failed', failure: { kind: 'issue', error: certError(s, domain) } };
    return undefined;
  };
}

/** waitForStatus for a certificate: the verdicts of certificateCheck, `timeout` when the bound passes. */
export async function waitForCertificate(
  source: StatusSource,
  domain: string,
  generation: number,
  o: { timeoutMs: number; signal: AbortSignal; clock: Clock },
): Promise<CertVerdict | { kind: 'closed' }> {
  let verdict: CertVerdict | undefined;
  const check = certificateCheck(domain, generation);
  const r = await waitForStatus(
    source,
    (s) => {
      verdict = check(s);
      return verdict === undefined ? undefined : verdict.kind === 'ready' ? { kind: 'ready' } : { kind: 'failed', reason: '' };
    },
    {
      ...o,
      onTimeout: () => {
        verdict = { kind: 'failed', failure: { kind: 'timeout' } };
        return { kind: 'failed', reason: '' };
      },
    },
  );
  if (r.kind === 'closed') return r;
  return verdict ?? { kind: 'failed', failure: { kind: 'timeout' } };
}
