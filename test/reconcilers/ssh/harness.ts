// A running SSH loop under the real controller, a spec to edit, and HTTP through the sockets.

import { request } from 'node:http';
import { pino } from 'pino';
import { SERVICE_HEADER } from '../../../src/dataplane/index.js';
import { Controller } from '../../../src/reconcilers/controller.js';
import type { Condition } from '../../../src/reconcilers/conditions.js';
import { createSshLoop, replicaObjectKey, type SshLoop, type SshLoopOptions } from '../../../src/reconcilers/ssh/index.js';
import { replicaTunnelOutputs } from '../../../src/reconcilers/outputs.js';
import type { HeldReplica, SshDesired } from '../../../src/reconcilers/ssh/plan.js';
import type { DesiredReplica } from '../../../src/reconcilers/ssh/targets.js';
import { emptyState, type ProxyState, type Replica } from '../../../src/spec/types.js';
import { eventually } from '../../helpers/nginx.js';
import { tmpDir } from '../../helpers/tmp.js';

export interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export function specOf(projectKey: string, services: Record<string, Replica[]>): ProxyState {
  const state = emptyState();
  state.spec.projects = [{ name: 'main', sshPrivateKey: projectKey }];
  state.spec.services = Object.entries(services).map(([run, replicas]) => ({
    project: 'main',
    run,
    https: false,
    auth: false,
    clientMaxBodySize: 1024,
    stripPrefix: true,
    rateLimits: [],
    replicas,
  }));
  return state;
}

export interface Harness {
  loop: SshLoop;
  controller: Controller;
  /** Store a new spec (a new generation) and wait for the passes to finish. */
  put(state: ProxyState): Promise<void>;
  /** A resync: a pass with the same generation. */
  resync(): Promise<void>;
  conditions(serviceKey: string, replicaId: string): Condition[] | undefined;
  ready(serviceKey: string, replicaId: string): Condition | undefined;
  /** The replica's published reconnects (logins after the first), undefined when not held. */
  reconnects(serviceKey: string, replicaId: string): number | undefined;
  /** The status keys of the replicas held (those with tunnel outputs). */
  replicaKeys(): string[];
  /** Waits until the replica's Ready condition has `reason`. */
  waitReason(serviceKey: string, replicaId: string, reason: string, timeoutMs?: number): Promise<Condition>;
  get(serviceKey: string, path?: string): Promise<Reply>;
  close(): Promise<void>;
}

export async function startHarness(initial: ProxyState, opts: Partial<SshLoopOptions> = {}): Promise<Harness> {
  const { dir, cleanup } = tmpDir('dp-ssh-');
  let current = { state: initial, generation: 1 };
  const loop = createSshLoop({
    stateDir: dir,
    keepaliveIntervalMs: 500,
    keepaliveCountMax: 3,
    reconnect: { baseMs: 200, maxMs: 1_000 },
    probeIntervalMs: 1_000,
    channelOpenTimeoutMs: 5_000,
    drainMs: 2_000,
    ...opts,
  });
  const controller = new Controller({ loops: [loop], getSpec: () => current, logger: pino({ level: 'silent' }) });
  await controller.start();
  const conditions = (sk: string, id: string): Condition[] | undefined =>
    controller.statuses().loops.ssh?.objects[replicaObjectKey(sk, id)]?.conditions;
  const ready = (sk: string, id: string): Condition | undefined => conditions(sk, id)?.find((c) => c.type === 'Ready');
  return {
    loop,
    controller,
    reconnects: (sk, id) => replicaTunnelOutputs(controller.statuses(), sk, id)?.reconnects,
    replicaKeys: () =>
      Object.entries(controller.statuses().loops.ssh?.objects ?? {})
        .filter(([, o]) => o.outputs?.reconnects !== undefined)
        .map(([k]) => k),
    async put(state) {
      current = { state, generation: current.generation + 1 };
      controller.notify();
      await controller.whenIdle();
    },
    async resync() {
      await controller.reconcileAll();
      await controller.whenIdle();
    },
    conditions,
    ready,
    waitReason: (sk, id, reason, timeoutMs = 20_000) =>
      eventually(() => {
        const c = ready(sk, id);
        return c?.reason === reason ? c : undefined;
      }, timeoutMs).catch((err: unknown) => {
        throw new Error(`${sk}/${id} never reached ${reason} (last: ${JSON.stringify(ready(sk, id))}): ${String(err)}`);
      }),
    // On the shared socket the request names its service, as Nginx's site would.
    get: (sk, path = '/') =>
      httpOverSocket(loop.balancer.socketPathFor(sk), path, loop.balancer.sharedSocketPath ? { [SERVICE_HEADER]: sk } : {}),
    async close() {
      await controller.stop(); // closes the loop: its sockets and tunnels
      cleanup();
    },
  };
}

export function httpOverSocket(socketPath: string, path = '/', headers: Record<string, string> = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path, agent: false, headers: { host: 'svc.test', ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The `name` an echo backend put in its reply. */
export function echoName(r: Reply): string {
  return (JSON.parse(r.body) as { name: string }).name;
}

/** What a loop holds once it has done everything `d` asks: every socket and every replica as desired. */
export function heldAs(d: SshDesired): { services: Set<string>; replicas: Map<string, HeldReplica> } {
  const replicas = new Map<string, HeldReplica>();
  for (const s of d.services) for (const r of s.replicas) replicas.set(r.id, { serviceKey: r.serviceKey, fingerprint: r.fingerprint });
  return { services: new Set(d.services.map((s) => s.serviceKey)), replicas };
}

/** The desired replica of that id, wherever it is. */
export function desiredReplica(d: SshDesired, id: string): DesiredReplica | undefined {
  for (const s of d.services) for (const r of s.replicas) if (r.id === id) return r;
  return undefined;
}
