// The process that holds the tunnels in the ssh benchmarks: the SSH loop (connections, probes,
// keepalives, balancer sockets) under the real controller and nothing else, so its RSS and CPU
// are the tunnels' own. Driven over IPC by bench/ssh.ts:
//   → { spec: ProxyState, stateDir }   ← { ready: true } once every replica is Ready
//   → 'stats'                          ← { rss, cpuUs }
//   → 'stop'                           (exits)

import { pino } from 'pino';
import { Controller } from '../src/reconcilers/controller.js';
import { createSshLoop } from '../src/reconcilers/ssh/index.js';
import type { AnyLoop } from '../src/reconcilers/types.js';
import type { ProxyState } from '../src/spec/types.js';

export interface ChildStart {
  spec: ProxyState;
  stateDir: string;
}

export interface ChildStats {
  rss: number;
  /** User + system CPU time since the process started, µs. */
  cpuUs: number;
}

function send(msg: unknown): void {
  process.send?.(msg);
}

async function start(m: ChildStart): Promise<void> {
  // Every replica behind the one bench server stands for a replica on a machine of its own: a
  // connection each, as a fleet of distinct hosts has (shared, they would all be one connection).
  const loop = createSshLoop({ stateDir: m.stateDir, appHost: '127.0.0.1', shareConnections: false });
  const controller = new Controller({
    loops: [loop as unknown as AnyLoop],
    getSpec: () => ({ state: m.spec, generation: 1 }),
    logger: pino({ level: 'silent' }),
  });
  await controller.start();
  const want = m.spec.spec.services.reduce((n, s) => n + s.replicas.length, 0);
  for (;;) {
    const objects = controller.statuses().loops.ssh?.objects ?? {};
    const ready = Object.values(objects).filter((c) => c?.conditions[0]?.status === 'True').length;
    if (ready >= want) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  send({ ready: true });
  process.on('message', (msg) => {
    if (msg === 'stats') {
      const cpu = process.cpuUsage();
      send({ rss: process.memoryUsage().rss, cpuUs: cpu.user + cpu.system } satisfies ChildStats);
    } else if (msg === 'stop') {
      void controller
        .stop()
        .then(() => loop.close())
        .finally(() => process.exit(0));
    }
  });
}

process.once('message', (m) => {
  start(m as ChildStart).catch((err: unknown) => {
    process.stderr.write(`ssh-child: ${String(err)}\n`);
    process.exit(1);
  });
});
