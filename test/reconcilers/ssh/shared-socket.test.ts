// The SSH loop with one shared socket for every service (the gateway's wiring): each service is
// served on it once its replicas are in rotation; a removed one (no router here: at once) is
// answered 503 while the socket keeps serving the others. Retiring behind a router is the same
// plan either way (plan.test.ts); the gateway's removal test runs it through Nginx.

import { existsSync, statSync } from 'node:fs';
import type { Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serviceSocketOutputs } from '../../../src/reconcilers/outputs.js';
import { close, startEcho } from '../../helpers/http.js';
import { freePorts } from '../../helpers/ports.js';
import { echoName, specOf, startHarness, type Harness } from './harness.js';

let echoes: Server[];
let ports: number[];
let h: Harness | undefined;

beforeAll(async () => {
  ports = await freePorts(2);
  echoes = await Promise.all(ports.map((p, i) => startEcho(`app${i}`, { port: p })));
});

afterAll(async () => {
  await h?.close();
  await Promise.all((echoes ?? []).map(close));
});

const direct = (id: string, i: number) => ({ id, appPort: ports[i]!, direct: { host: '127.0.0.1', port: ports[i]! } });

describe('SSH loop on the shared socket', () => {
  it('serves every service on one socket, published as each service’s socket path', async () => {
    h = await startHarness(specOf('unused', { a: [direct('d0', 0)], b: [direct('d1', 1)] }), { sharedSocket: true });
    const sock = h.loop.balancer.sharedSocketPath!;
    expect(sock.endsWith('/sockets/dataplane.sock')).toBe(true);
    expect(statSync(sock).mode & 0o777).toBe(0o600);
    expect(h.loop.balancer.listening().sort()).toEqual(['main/a', 'main/b']);
    const statuses = h.controller.statuses();
    expect(serviceSocketOutputs(statuses, 'main/a')).toEqual({ socketPath: sock });
    expect(serviceSocketOutputs(statuses, 'main/b')).toEqual({ socketPath: sock });
    expect(echoName(await h.get('main/a'))).toBe('app0');
    expect(echoName(await h.get('main/b'))).toBe('app1');
  });

  it('answers a removed service 503 and keeps serving the others', async () => {
    await h!.put(specOf('unused', { a: [direct('d0', 0)] }));
    expect(h!.loop.balancer.listening()).toEqual(['main/a']);
    const r = await h!.get('main/b');
    expect(r.status).toBe(503);
    expect(JSON.parse(r.body)).toEqual({ detail: 'Service main/b has no ready replica' });
    expect(serviceSocketOutputs(h!.controller.statuses(), 'main/b')).toBeUndefined();
    // The socket stays for the others.
    expect(existsSync(h!.loop.balancer.sharedSocketPath!)).toBe(true);
    expect(echoName(await h!.get('main/a'))).toBe('app0');
  });

  it('removes the shared socket when the loop closes', async () => {
    const sock = h!.loop.balancer.sharedSocketPath!;
    await h!.controller.stop();
    expect(existsSync(sock)).toBe(false);
    expect(h!.loop.balancer.listening()).toEqual([]);
  });
});
