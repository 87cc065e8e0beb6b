// One daemon assembly for both deployments. A profile lists what differs — the store, the loop
// modules, the route modules and their listeners — and assemble() does the rest the same way
// for both: one cleanup stack (whatever a later step fails on, everything acquired before is
// released in reverse order), one controller over the loops, one Runtime for the API, and one
// change event: the store's watch. A write through the API is reported by that watch before
// the write returns, and an edit from outside (another process, a restore of state.json, a
// database row) arrives the same way, so both daemons notice them alike.

import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { buildApp, type AppOptions, type RouteModule } from '../api/app.js';
import { planFromController } from '../api/plan.js';
import type { Runtime } from '../api/runtime.js';
import { systemClock, type Clock } from '../clock.js';
import { Controller } from '../reconcilers/controller.js';
import type { AnyLoop } from '../reconcilers/types.js';
import type { StoredState } from '../state/store.js';
import type { WatchedStateStore } from '../state/watched-store.js';

export type { RouteModule };

/** Something to release at close (or when a later step of the assembly throws). */
export type Cleanup = () => unknown;

/** The daemon so far, as the profile's steps see it. */
export interface Assembly {
  logger: Logger;
  clock: Clock | undefined;
  store: WatchedStateStore;
  /** The generation being served; the store's watch moves it. */
  current(): StoredState;
  /** The controller over the profile's loops; there once `loops` has returned (closures may capture it earlier). */
  readonly controller: Controller;
  /** Puts `cleanup` on the stack: it runs at close, after everything pushed later. */
  defer(cleanup: Cleanup): void;
}

/** One HTTP listener: an app of route modules (buildApp's options without runtime and logger). */
export interface ListenerProfile {
  host: string;
  port: number;
  app: Omit<AppOptions, 'runtime' | 'logger' | 'statusExtra' | 'liveStatus'>;
}

export interface Profile {
  logger: Logger;
  clock?: Clock;
  resyncIntervalMs?: number;
  /** Refusals that come before anything is touched (management open to the network). */
  preflight?(): Promise<void>;
  /** The document. Always a watched store: its watch is the daemon's one change event. */
  store(): Promise<WatchedStateStore>;
  /** The loop modules (and whatever they need, its release deferred); the controller orders them. */
  loops(d: Assembly): Promise<AnyLoop[]>;
  /** More top-level fields of GET /api/v1/status (the gateway: Nginx's reloads). */
  statusExtra?(): Record<string, unknown>;
  /** Facts a dry-run plan adds per loop (the gateway: whether Nginx would reload). */
  planNotes?(loop: string, kinds: string[]): Record<string, unknown> | undefined;
  /**
   * Told of the generation read at start (awaited: a failure fails the start) and then of every
   * new one after the controller (the model API's first-seen times).
   */
  onGeneration?(s: StoredState): Promise<void>;
  /** The listeners and their route modules; the first is the daemon's main app. */
  listeners(d: Assembly): Promise<ListenerProfile[]>;
  /** Once the apps are built, before they listen (the private Nginx, the access-log tail). */
  beforeListen?(apps: FastifyInstance[]): Promise<void>;
  /** Once every listener listens, before the first pass (fills in ports picked by the kernel). */
  listening?(ports: number[], d: Assembly): void;
  /**
   * Taking over from a process that still holds the ports (asked after preflight): the first
   * pass runs before the listeners bind; once it has settled, `takeOver` makes this process
   * the one served and tells the other to stop, and the listeners then bind as soon as the
   * other has let go of their ports (within `takeOverListenMs`).
   */
  takingOver?(): boolean;
  takeOver?(): Promise<void>;
  takeOverListenMs?: number;
  /**
   * When the daemon is ready (/readyz): `settled` once every loop has settled the first pass
   * (certificates still being requested arrive later), `done` once the first pass finished.
   */
  readyWhen: 'settled' | 'done';
  /** Once ready (a log line), with each listener's http://host:port. */
  ready?(d: Assembly, urls: string[]): void;
}

export interface Daemon {
  store: WatchedStateStore;
  controller: Controller;
  current(): StoredState;
  /** One app per listener, in the profile's order. */
  apps: FastifyInstance[];
  /** http://host:port of each listener. */
  urls: string[];
  /** Releases everything in reverse order of acquisition; idempotent. */
  close(): Promise<void>;
}

export async function assemble(profile: Profile): Promise<Daemon> {
  const { logger } = profile;
  const stack: Cleanup[] = [];
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closing ??= (async () => {
      for (const cleanup of stack.splice(0).reverse()) {
        await Promise.resolve()
          .then(cleanup)
          .catch((err: unknown) => logger.warn({ err }, 'shutdown step failed'));
      }
    })());
  try {
    await profile.preflight?.();
    const store = await profile.store();
    stack.push(() => store.close());
    let current = await store.read();
    await profile.onGeneration?.(current);
    let controller: Controller | undefined;
    const d: Assembly = {
      logger,
      clock: profile.clock,
      store,
      current: () => current,
      get controller(): Controller {
        if (!controller) throw new Error('the controller is created once the loops are');
        return controller;
      },
      defer: (cleanup) => void stack.push(cleanup),
    };

    const loops = await profile.loops(d);
    const ctl = new Controller({
      loops,
      getSpec: () => ({ state: current.state, generation: current.generation }),
      logger: logger.child({ component: 'controller' }),
      ...(profile.resyncIntervalMs ? { resyncIntervalMs: profile.resyncIntervalMs } : {}),
      ...(profile.clock ? { clock: profile.clock } : {}),
    });
    controller = ctl;
    // Stops passes and closes every loop (reverse dependency order).
    stack.push(() => ctl.stop());
    stack.push(
      store.watch((next) => {
        current = next;
        logger.info({ generation: next.generation, hash: next.hash }, 'serving a new generation');
        ctl.notify();
        profile
          .onGeneration?.(next)
          .catch((err: unknown) => logger.error({ err, generation: next.generation }, 'a new generation could not be recorded'));
      }),
    );
    // An edit between the first read and the watch: reading again reports it to the listener.
    current = await store.read();

    let ready = false;
    const runtime: Runtime = {
      store,
      plan: (next, base) => planFromController(ctl, next, base, profile.planNotes?.bind(profile)),
      status: () => ctl.statuses(),
      isReady: () => ready,
    };
    const appLogger = logger.child({ component: 'api' });
    const listeners = await profile.listeners(d);
    const apps: FastifyInstance[] = [];
    for (const l of listeners) {
      const app = await buildApp({
        ...l.app,
        runtime,
        logger: appLogger,
        statusExtra: () => ({ store: store.health(), ...profile.statusExtra?.() }),
        // Read per status request: what changes with every request is never written as status.
        liveStatus: () => Object.fromEntries(loops.flatMap((lp) => (lp.liveStatus ? [[lp.name, lp.liveStatus()]] : []))),
      });
      stack.push(() => app.close());
      apps.push(app);
    }

    await profile.beforeListen?.(apps);
    const ports: number[] = [];
    const listen = async (retryMs: number): Promise<void> => {
      for (const [i, l] of listeners.entries()) {
        await listenRetrying(apps[i]!, l, retryMs, profile.clock ?? systemClock);
        ports.push((apps[i]!.server.address() as { port: number }).port);
      }
      profile.listening?.(ports, d);
    };
    const takingOver = profile.takingOver?.() ?? false;
    if (!takingOver) await listen(0);

    const first = ctl.start();
    if (profile.readyWhen === 'settled') {
      // A loop whose start() fails fails whenSettled too: the rejection is handled there.
      first.then(
        () => logger.info({ generation: current.generation }, 'first reconcile pass finished'),
        () => undefined,
      );
      await ctl.whenSettled();
    } else {
      await first;
    }
    if (takingOver) {
      await profile.takeOver!();
      await listen(profile.takeOverListenMs ?? 30_000);
    }
    ready = true;
    const urls = listeners.map((l, i) => `http://${urlHost(l.host)}:${ports[i]}`);
    profile.ready?.(d, urls);
    return { store, controller: ctl, current: () => current, apps, urls, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** How often a listener whose port another process still holds tries again. */
const LISTEN_RETRY_MS = 20;

/** Listens; a port in use is tried again every LISTEN_RETRY_MS for up to `retryMs`. */
async function listenRetrying(app: FastifyInstance, l: ListenerProfile, retryMs: number, clock: Clock): Promise<void> {
  const until = clock.now() + retryMs;
  for (;;) {
    try {
      await app.listen({ host: l.host, port: l.port });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE' || clock.now() >= until) throw err;
      await new Promise<void>((resolve) => clock.setTimeout(resolve, LISTEN_RETRY_MS));
    }
  }
}

/** A host as it goes into a URL (IPv6 in brackets). */
export function urlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}
