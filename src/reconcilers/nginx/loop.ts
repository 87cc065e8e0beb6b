// The Nginx loop: desired = rendered files; observed = the owned files on disk; plan = one
// action per file that differs; applyBatch = test the candidate tree, hold back what fails,
// swap the rest in and reload once (apply.ts). Status per site: `Ready`, and `Degraded` with
// nginx's own error line when a site is held back.

import { TerminalError } from '../../errors.js';
import type { ProxyState, Service } from '../../spec/types.js';
import type { Action, BatchOutcome, Loop, LoopContext, MetricFamily, StatusSnapshot, StatusWriter } from '../types.js';
import { applyFiles, diffFiles, removeApplyLeftovers, unifiedDiff, type FileChange, type OwnedFiles } from './apply.js';
import { GLOBAL_FILE, SITES_SUBDIR } from './names.js';
import type { NginxProcessInfo, ReloadHint, ReloadOutcome, ReloadUnconfirmed, TestResult } from './nginx-process.js';
import { nginxMetricFamilies } from './metrics.js';
import { OwnedConf } from './owned-conf.js';
import { siteRenders } from './site-renders.js';
import type { CertPaths, UpstreamTarget, ViewOptions } from './view.js';

export { NGINX_LOOP } from '../outputs.js';
import { certificateOutputs, NGINX_LOOP, TLS_LOOP } from '../outputs.js';

export interface NginxLoopOptions {
  /** The managed conf dir (global file + sites/), included by the main conf. */
  confDir: string;
  /**
   * How often a pass stats every owned file to find hand edits; passes in between list the
   * directory and trust what they read or wrote. Default 60 s; the gateway uses its resync
   * interval, so a resync repairs drift as before.
   */
  verifyEveryMs?: number;
  mainConfPath: string;
  view: Omit<ViewOptions, 'certFor' | 'upstreamFor'>;
  test: (confPath: string) => Promise<TestResult>;
  /** The hint says how long `nginx -t` of the same files took (a reload parses them again). */
  reload: (hint?: ReloadHint) => Promise<ReloadOutcome>;
  /**
   * Where a service's traffic goes; default its direct replicas. Given by the composition root,
   * not read from the SSH loop's status: a balancer socket's path is a pure function of the
   * socket dir (which the root hands to both loops) and the service key, and never changes for
   * a service, so reading it from status would only add a dependency on a status this loop is
   * deliberately not triggered by (tunnels going up and down must not run Nginx passes).
   */
  upstreamFor?: (service: Service) => UpstreamTarget;
  /** Test hook: rewrite a rendered file before it is planned (inject a broken site). */
  renderHook?: (fileName: string, text: string) => string;
  /** Dependencies whose status feeds `desired`. */
  dependsOn?: readonly string[];
  /** The dependencies whose status changes trigger a pass (default: all of dependsOn). */
  triggeredBy?: readonly string[];
  /**
   * Reload at most once per this interval (ms; default 0 = no limit; the gateway sets
   * DEFAULT_MIN_RELOAD_INTERVAL_MS). A change right after a reload waits for the end of the
   * interval and goes in with every change made meanwhile.
   */
  minReloadIntervalMs?: number;
  /** The generation of the stored document now: a batch that waited and is out of date is left to the next pass. */
  currentGeneration?: () => number;
  /** The private Nginx's supervisor: its restarts are reported under PROCESS_KEY. */
  supervisor?: () => NginxProcessInfo;
  /**
   * The private Nginx master, when this loop runs one: started with the loop (before its first
   * pass, which reloads it) and stopped when the loop closes. Its restarts are reported as
   * with `supervisor`.
   */
  master?: { start(): Promise<void>; stop(): Promise<void>; readonly info: NginxProcessInfo };
}

/** The gateway's minimum time between two reloads. */
export const DEFAULT_MIN_RELOAD_INTERVAL_MS = 1_000; // 1 s

/** When a pass looks again at a reload whose previous workers still accepted. */
const UNCONFIRMED_RECHECK_MS = 2_000; // 2 s

/** Status object of the private Nginx master, once it has died and been restarted. */
export const PROCESS_KEY = '(nginx)';

/** An action's payload: the change to one file, as diffFiles found it. */
export type FilePayload = FileChange;

export interface NginxLoopStats {
  /** sha256 over the owned files as last observed (names and contents), for /metrics. */
  configHash: string | null;
  reloads: number;
  reloadFailures: number;
  lastReloadAt: number | null;
  filesWritten: number;
  /** A batch is waiting for the end of the minimum interval between reloads. */
  waitingForReload: boolean;
  /** Batches that waited for it. */
  reloadsDeferred: number;
  /** Batches that reloaded inside the interval because a caller was waiting for them (hurry). */
  reloadsHurried: number;
}

/**
 * The certificate a domain is served with (pure): the TLS loop's published copy, once its
 * outputs name one and its Ready is True; null renders the site HTTP only.
 */
export function certFromTlsOutputs(domain: string, statuses: StatusSnapshot): CertPaths | null {
  const out = certificateOutputs(statuses, domain);
  if (!out?.serial || !out.certPath || !out.keyPath) return null;
  const ready = statuses.loops[TLS_LOOP]?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
  return ready?.status === 'True' ? { certPath: out.certPath, keyPath: out.keyPath } : null;
}

export function createNginxLoop(o: NginxLoopOptions): Loop<Map<string, string>, OwnedFiles, FilePayload> & {
  stats: NginxLoopStats;
  metrics(): MetricFamily[];
  /**
   * Somebody waits for the document at `generation` to be served (a registration that answers
   * once its new site is): until a reload at that generation or later, no batch waits out the
   * interval, and the one waiting now goes at once.
   */
  hurry(generation: number): void;
} {
  const stats: NginxLoopStats = {
    configHash: null,
    reloads: 0,
    reloadFailures: 0,
    lastReloadAt: null,
    filesWritten: 0,
    waitingForReload: false,
    reloadsDeferred: 0,
    reloadsHurried: 0,
  };
  /** The generation a caller waits to see reloaded (hurry); 0: nobody waits. */
  let hurriedFor = 0;
  /** Ends the current wait for the interval early, while a batch waits. */
  let wake: (() => void) | null = null;
  const minReloadIntervalMs = o.minReloadIntervalMs ?? 0;
  if (!(minReloadIntervalMs >= 0)) throw new TypeError('minReloadIntervalMs must be >= 0');
  /** The owned files as last read, checked against the disk once per verifyEveryMs. */
  const conf = new OwnedConf(o.confDir, o.verifyEveryMs ?? 60_000);
  /** Sites of a reload whose previous workers still accepted at its deadline: not Applied yet. */
  let unconfirmed: { check: ReloadUnconfirmed; keys: Set<string> } | null = null;
  /** The foreign files as last observed: a test of the changed sites keeps them in. */
  let foreign: ReadonlySet<string> = new Set();
  /**
   * A reload Nginx refused after a test of the changed sites alone: the next apply tests the
   * whole tree, which finds the file to hold back.
   */
  let testWholeTree = false;
  // Before the first look at the conf dir: what a crash in the middle of an apply left there.
  let leftovers: Promise<void> | null = null;
  const removeLeftovers = (ctx: LoopContext): Promise<void> =>
    (leftovers ??= removeApplyLeftovers(o.confDir, o.mainConfPath).then(
      (removed) => {
        if (removed.length > 0) ctx.logger.warn({ removed }, 'removed files an interrupted apply left behind');
      },
      (err: unknown) => ctx.logger.warn({ err }, 'could not remove the files an interrupted apply left behind'),
    ));
  const renders = siteRenders({ view: o.view, ...(o.upstreamFor ? { upstreamFor: o.upstreamFor } : {}) });
  const master = o.master;
  const supervisor = o.supervisor ?? (master ? () => master.info : undefined);
  return {
    name: NGINX_LOOP,
    stats,
    metrics: () => nginxMetricFamilies(() => stats, supervisor),
    hurry(generation: number) {
      hurriedFor = Math.max(hurriedFor, generation);
      wake?.();
    },
    ...(master ? { start: () => master.start(), close: () => master.stop() } : {}),
    ...(o.dependsOn ? { dependsOn: o.dependsOn } : {}),
    ...(o.triggeredBy ? { triggeredBy: o.triggeredBy } : {}),

    desired(spec: ProxyState, statuses: StatusSnapshot): Map<string, string> {
      const certFor = (d: string) => certFromTlsOutputs(d, statuses);
      const files = renders.render(spec, certFor);
      if (o.renderHook) return new Map([...files].map(([name, text]) => [name, o.renderHook!(name, text)]));
      return files;
    },

    async observe(ctx: LoopContext): Promise<OwnedFiles> {
      await removeLeftovers(ctx);
      if (unconfirmed && (await unconfirmed.check.settled())) {
        const waiting = (key: string) => ctx.status.get(key)?.some((c) => c.type === 'Ready' && c.reason === 'ReloadUnconfirmed');
        for (const key of unconfirmed.keys) {
          if (waiting(key)) ctx.status.set(key, served());
        }
        // Forget it once the status says so (a dry run's observe writes nothing).
        if (![...unconfirmed.keys].some(waiting)) unconfirmed = null;
      }
      const observed = await conf.read(ctx.clock.now());
      const { owned } = observed;
      foreign = observed.foreign;
      stats.configHash = conf.hash(owned);
      // Sites already on disk (adopted at start, or unchanged since) are serving: say so once.
      // Sites held back before they ever reached the disk keep their rejection on record
      // until the controller releases their key (released() below).
      const keys = [...owned.keys()].map(objectKey);
      const rejected = ctx.status.keys().filter((k) => ctx.status.get(k)?.some((c) => c.type === 'Ready' && c.status === 'False'));
      const proc = supervisor?.();
      const procKey = proc && reportProcess(ctx, proc) ? [PROCESS_KEY] : [];
      ctx.status.prune([...keys, ...rejected, ...procKey]);
      for (const key of keys) {
        if (!ctx.status.get(key)) ctx.status.set(key, served());
      }
      return observed;
    },

    plan(desired: Map<string, string>, observed: OwnedFiles): Action<FilePayload>[] {
      return diffFiles(desired, observed).map((change) =>
        change.kind === 'conflict'
          ? {
              key: change.name,
              kind: 'conflict',
              summary: `skip ${change.name}: a file not written by dstack-proxy is in the way`,
              payload: change,
            }
          : withLazyDiff({ key: change.name, kind: change.kind, summary: `${change.kind} ${change.name}`, payload: change }),
      );
    },

    async released(names: string[], ctx: LoopContext): Promise<void> {
      // A failing file that is no longer planned: gone from the document, or on disk as desired.
      const { owned } = await conf.verify();
      for (const name of names) {
        const key = objectKey(name);
        if (!owned.has(name)) ctx.status.delete(key);
        else markApplied(ctx.status, key, served());
      }
    },

    async applyBatch(actions: Action<FilePayload>[], ctx: LoopContext): Promise<ReadonlyMap<string, BatchOutcome>> {
      const changes: FileChange[] = [];
      const outcomes = new Map<string, BatchOutcome>();
      // 0. At most one reload per interval. Every reload makes old workers finish their
      //    requests and new ones start; a stream of PUTs one service at a time would reload
      //    once per PUT. The first change after a quiet interval goes in at once; one right
      //    after a reload waits for the end of the interval. A newer document stored while it
      //    waited makes this batch stale: the pass that follows (already triggered) plans
      //    everything from that document, and reloads at once.
      //    A caller waiting for this reload (hurry) is worth more than the pacing: concurrent
      //    callers still share one reload, a caller alone costs one.
      const wait = stats.lastReloadAt === null ? 0 : stats.lastReloadAt + minReloadIntervalMs - ctx.clock.now();
      const reloading = actions.some((a) => a.kind !== 'conflict');
      if (wait > 0 && reloading && hurriedFor > 0) stats.reloadsHurried++;
      else if (wait > 0 && reloading) {
        stats.reloadsDeferred++;
        stats.waitingForReload = true;
        let timer: unknown;
        try {
          await new Promise<void>((r) => {
            wake = r;
            timer = ctx.clock.setTimeout(r, wait);
          });
        } finally {
          ctx.clock.clearTimeout(timer);
          wake = null;
          stats.waitingForReload = false;
        }
        if (o.currentGeneration && o.currentGeneration() !== ctx.generation) {
          return new Map(actions.map((a) => [a.key, { requeueAfterMs: 0 }]));
        }
      }
      for (const { payload: p } of actions) {
        if (p.kind === 'conflict') {
          const message = `${o.confDir}/${p.name} exists and was not written by dstack-proxy; move it away to let this site be served`;
          outcomes.set(p.name, { error: new TerminalError(message) });
          ctx.status.set(objectKey(p.name), { type: 'Ready', status: 'False', reason: 'FileConflict', message });
        } else changes.push(p);
      }
      const deleted = new Set(changes.filter((c) => c.kind === 'delete').map((c) => c.name));
      const result = await applyFiles({
        changes,
        sitesDir: o.confDir,
        mainConfPath: o.mainConfPath,
        test: o.test,
        reload: async (hint) => {
          try {
            const outcome = await o.reload(hint);
            stats.reloads++;
            stats.lastReloadAt = ctx.clock.now();
            if (ctx.generation >= hurriedFor) hurriedFor = 0;
            return outcome;
          } catch (err) {
            stats.reloadFailures++;
            throw err;
          }
        },
        ...(testWholeTree ? {} : { changedOnly: { foreign } }),
        logger: ctx.logger,
      });
      if (result.rolledBack) testWholeTree = true;
      else if (result.reloaded) testWholeTree = false;
      // What this batch wrote (or rolled back) is read back; the rest is as the pass observed it.
      stats.configHash = conf.hash((await conf.afterWrite(changes.map((c) => c.name))).owned);
      if (result.unconfirmed) {
        unconfirmed = { check: result.unconfirmed, keys: new Set([...(unconfirmed?.keys ?? []), ...result.applied.map(objectKey)]) };
        ctx.logger.warn({ files: result.applied.length }, result.unconfirmed.unconfirmed);
      }
      for (const name of result.applied) {
        const key = objectKey(name);
        if (deleted.has(name)) {
          outcomes.set(name, 'done');
          ctx.status.delete(key);
          continue;
        }
        stats.filesWritten++;
        if (result.unconfirmed) {
          // Come back to confirm: observe() flips it to Applied once the old workers are gone.
          outcomes.set(name, { requeueAfterMs: UNCONFIRMED_RECHECK_MS });
          markApplied(ctx.status, key, {
            type: 'Ready',
            status: 'Unknown',
            reason: 'ReloadUnconfirmed',
            message: result.unconfirmed.unconfirmed,
          });
        } else {
          outcomes.set(name, 'done');
          markApplied(ctx.status, key, served());
        }
      }
      for (const { file, message } of result.heldBack) {
        outcomes.set(file, { error: new Error(message) });
        const key = objectKey(file);
        const wasServing = ctx.status.get(key) !== undefined;
        ctx.status.set(key, {
          type: 'Ready',
          status: wasServing ? 'True' : 'False',
          reason: wasServing ? 'ServingPrevious' : 'ConfigRejected',
          message: wasServing ? 'the previous version is still served' : message,
        });
        ctx.status.set(key, { type: 'Degraded', status: 'True', reason: 'ConfigRejected', message });
      }
      return outcomes;
    },
  };
}

/**
 * The master's condition, once it has exited unexpectedly (before that, nothing to report:
 * the sites' own conditions say it serves). False while it is down.
 */
function reportProcess(ctx: LoopContext, p: NginxProcessInfo): boolean {
  if (p.lastExit === null) return false;
  const how = p.lastExit.signal ? `signal ${p.lastExit.signal}` : `exit code ${p.lastExit.code}`;
  const when = new Date(p.lastExit.at).toISOString();
  const stale = p.staleStopped > 0 ? `; stopped ${p.staleStopped} leftover Nginx process(es) of this prefix` : '';
  if (p.running) {
    const message = `restarted (pid ${p.pid}) after it exited with ${how} at ${when}; ${p.restarts} restart(s) so far${stale}`;
    ctx.status.set(PROCESS_KEY, { type: 'Ready', status: 'True', reason: 'Restarted', message });
  } else if (p.restartError) {
    ctx.status.set(PROCESS_KEY, {
      type: 'Ready',
      status: 'False',
      reason: 'RestartFailed',
      message: `exited with ${how} at ${when}; restart failed: ${p.restartError}`,
    });
  } else {
    ctx.status.set(PROCESS_KEY, {
      type: 'Ready',
      status: 'False',
      reason: 'Restarting',
      message: `exited with ${how} at ${when}; restarting`,
    });
  }
  return true;
}

/**
 * The action with its unified diff computed when first read: a dry run shows it, a pass
 * applying 1,000 new sites never needs it.
 */
function withLazyDiff(action: Omit<Action<FilePayload>, 'diff'>): Action<FilePayload> {
  const { name, text, previous } = action.payload;
  let diff: string | undefined;
  return Object.defineProperty(action, 'diff', {
    enumerable: true,
    get: () => (diff ??= unifiedDiff(previous, text, name)),
  }) as Action<FilePayload>;
}

type ReadyCondition = Parameters<StatusWriter['set']>[1];

/** The Ready condition of a file nginx serves as written. */
function served(): ReadyCondition {
  return { type: 'Ready', status: 'True', reason: 'Applied', message: 'served by nginx' };
}

/** A file now on disk as desired: `ready` (served, or waiting for the reload to be confirmed), and nothing held back. */
function markApplied(status: StatusWriter, key: string, ready: ReadyCondition): void {
  status.set(key, ready);
  status.set(key, { type: 'Degraded', status: 'False', reason: 'Applied', message: '' });
}

/** Status object key of a file: the site's domain, or `global`. */
export function objectKey(fileName: string): string {
  if (fileName === GLOBAL_FILE) return 'global';
  const site = fileName.startsWith(`${SITES_SUBDIR}/`) ? fileName.slice(SITES_SUBDIR.length + 1) : fileName;
  return site.replace(/\.conf$/, '');
}
