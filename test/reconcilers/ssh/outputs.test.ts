// What the SSH loop publishes for other code: a socket path per listening service, reconnects
// per replica, and the tunnel metric families; and that the controller, not its caller, closes it.

import { existsSync } from 'node:fs';
import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serviceSocketOutputs } from '../../../src/reconcilers/outputs.js';
import type { MetricFamily } from '../../../src/reconcilers/types.js';
import { close, startEcho } from '../../helpers/http.js';
import { freePorts } from '../../helpers/ports.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

let echo: Server;
let port: number;
let h: Harness | undefined;

beforeAll(async () => {
  [port] = (await freePorts(1)) as [number];
  echo = await startEcho('app', { port });
});

afterAll(async () => {
  await h?.close();
  if (echo) await close(echo);
});

const direct = (id: string) => ({ id, appPort: port, direct: { host: '127.0.0.1', port } });

async function read(families: readonly MetricFamily[]): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const f of families) out[f.name] = { help: f.help, type: f.type, labelNames: f.labelNames, samples: await f.read() };
  return out;
}

describe('SSH loop outputs', () => {
  it('publishes the socket path of a listening service and the reconnects of each replica', async () => {
    h = await startHarness(specOf('unused', { app: [direct('d1')], other: [direct('d2')] }));
    const statuses = h.controller.statuses();
    const socketPath = h.loop.balancer.socketPathFor('main/app');
    expect(serviceSocketOutputs(statuses, 'main/app')).toEqual({ socketPath });
    expect(serviceSocketOutputs(statuses, 'main/other')).toEqual({ socketPath: h.loop.balancer.socketPathFor('main/other') });
    expect(existsSync(socketPath)).toBe(true);
    expect(echoName(await h.get('main/app'))).toBe('app');
    // A direct replica never logs in: no reconnects.
    expect(h.reconnects('main/app', 'd1')).toBe(0);
    expect(h.replicaKeys()).toEqual(['main/app/d1', 'main/other/d2']);
  });

  it('metrics() gives ssh_connections, and tunnel_up and tunnel_reconnects_total per replica held', async () => {
    expect(await read(h!.loop.metrics())).toEqual({
      ssh_connections: {
        help: 'SSH connections open; replicas reached through identical hops, user and key share one.',
        type: 'gauge',
        labelNames: [],
        samples: [[{}, 0]], // these replicas are direct: no SSH
      },
      tunnel_up: {
        help: 'Per replica tunnel: 1 when Ready.',
        type: 'gauge',
        labelNames: ['service', 'replica', 'state'],
        samples: [
          [{ service: 'main/app', replica: 'd1', state: 'Ready' }, 1],
          [{ service: 'main/other', replica: 'd2', state: 'Ready' }, 1],
        ],
      },
      tunnel_reconnects_total: {
        help: 'Per replica tunnel reconnects.',
        type: 'counter',
        labelNames: ['service', 'replica'],
        samples: [
          [{ service: 'main/app', replica: 'd1' }, 0],
          [{ service: 'main/other', replica: 'd2' }, 0],
        ],
      },
      replica_requests_in_flight: expect.objectContaining({
        type: 'gauge',
        labelNames: ['service', 'replica'],
        // Values: whatever the harness's own requests left (the data-plane tests check them).
        samples: [
          [{ service: 'main/app', replica: 'd1' }, expect.any(Number)],
          [{ service: 'main/other', replica: 'd2' }, expect.any(Number)],
        ],
      }),
      replica_requests_total: expect.objectContaining({
        type: 'counter',
        labelNames: ['service', 'replica'],
        // Values: whatever the harness's own requests left (the data-plane tests check them).
        samples: [
          [{ service: 'main/app', replica: 'd1' }, expect.any(Number)],
          [{ service: 'main/other', replica: 'd2' }, expect.any(Number)],
        ],
      }),
    });
  });

  it('a replica that cannot work is in the metrics with its reason', async () => {
    await h!.put(specOf('unused', { app: [direct('d1'), { id: 'bad', appPort: port }], other: [direct('d2')] }));
    const up = await h!.loop
      .metrics()
      .find((f) => f.name === 'tunnel_up')!
      .read();
    const bad = up.find(([labels]) => labels.replica === 'bad');
    expect(bad).toEqual([{ service: 'main/app', replica: 'bad', state: 'InvalidConfig' }, 0]);
    expect(h!.ready('main/app', 'bad')?.status).toBe('False');
  });

  it('removes the socket output when the socket closes, with its replicas', async () => {
    const socketPath = h!.loop.balancer.socketPathFor('main/other');
    await h!.put(specOf('unused', { app: [direct('d1')] }));
    const statuses = h!.controller.statuses();
    expect(serviceSocketOutputs(statuses, 'main/other')).toBeUndefined();
    expect(statuses.loops.ssh?.objects['main/other']).toBeUndefined();
    expect(existsSync(socketPath)).toBe(false);
    expect(h!.replicaKeys()).toEqual(['main/app/d1']);
    expect(serviceSocketOutputs(statuses, 'main/app')).toEqual({ socketPath: h!.loop.balancer.socketPathFor('main/app') });
  });

  it('controller.stop() closes the loop: sockets gone, no replica in the metrics', async () => {
    const socketPath = h!.loop.balancer.socketPathFor('main/app');
    await h!.controller.stop();
    expect(existsSync(socketPath)).toBe(false);
    expect(h!.loop.balancer.listening()).toEqual([]);
    expect(
      await h!.loop
        .metrics()
        .find((f) => f.name === 'tunnel_up')!
        .read(),
    ).toEqual([]);
    await h!.loop.close(); // a second close is harmless
  });
});
