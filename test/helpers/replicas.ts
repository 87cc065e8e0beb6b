// A real data plane (Replicas) over TCP replicas on 127.0.0.1, for tests and benches that run a
// front end without the SSH loop: replicasOf({ 'p/r': [port1, port2] }).

import { connect as netConnect, type Socket } from 'node:net';
import { Replicas, type ReplicasOptions, type Upstream } from '../../src/dataplane/index.js';

/** An always-Ready replica reached by TCP; `onOpen` sees every connection opened to it. */
export function tcpUpstream(port: number, host = '127.0.0.1', onOpen?: (s: Socket) => void): Upstream {
  return {
    isReady: () => true,
    open: () =>
      new Promise<Socket>((resolve, reject) => {
        const s = netConnect(port, host);
        s.once('error', reject);
        s.once('connect', () => {
          s.off('error', reject);
          onOpen?.(s);
          resolve(s);
        });
      }),
  };
}

/** Replicas with, per service key, replicas `<key>#0`, `<key>#1`… (a port is a TCP replica on 127.0.0.1). */
export function replicasOf(services: Record<string, (number | Upstream)[]>, o: ReplicasOptions = {}): Replicas {
  const replicas = new Replicas(o);
  for (const [key, list] of Object.entries(services)) {
    list.forEach((u, i) => replicas.set(key, `${key}#${i}`, typeof u === 'number' ? tcpUpstream(u) : u));
  }
  return replicas;
}
