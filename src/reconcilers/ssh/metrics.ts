// The SSH loop's metric families and live status: the SSH connections open, per replica its
// tunnel (up, reconnects) and its requests (in flight, total), read from the data plane at each
// scrape or status request.

import type { Replicas } from '../../dataplane/index.js';
import { replicaObjectKey } from '../outputs.js';
import type { MetricFamily } from '../types.js';
import type { TunnelState } from './tunnel.js';

/** One replica id's requests, as /api/v1/status shows them. */
export interface ReplicaLoadStatus {
  /** In flight now, pinned streams (WebSockets) included; the one it replaced, draining, too. */
  inFlight: number;
  /** Sent to it so far: the replica_requests_total counter. */
  requests: number;
}

/** replicas.loads() by service and replica id: a replaced replica draining adds to its id. */
function loadsById(replicas: Replicas): Map<string, { service: string; replica: string; inFlight: number; total: number }> {
  const out = new Map<string, { service: string; replica: string; inFlight: number; total: number }>();
  for (const l of replicas.loads()) {
    const key = replicaObjectKey(l.service, l.replica);
    const e = out.get(key);
    if (e === undefined) out.set(key, { service: l.service, replica: l.replica, inFlight: l.inFlight, total: l.total });
    else {
      e.inFlight += l.inFlight;
      e.total = Math.max(e.total, l.total); // the same tally on every entry of an id
    }
  }
  return out;
}

/** [service, replica id, state] of every replica held. */
type HeldTunnels = () => [string, string, TunnelState][];

export function sshMetricFamilies(
  tunnels: HeldTunnels,
  reconnects: (id: string) => number,
  replicas: Replicas,
  connections: () => number,
): MetricFamily[] {
  return [
    {
      name: 'ssh_connections',
      help: 'SSH connections open; replicas reached through identical hops, user and key share one.',
      type: 'gauge',
      labelNames: [],
      read: () => [[{}, connections()]],
    },
    {
      name: 'tunnel_up',
      help: 'Per replica tunnel: 1 when Ready.',
      type: 'gauge',
      labelNames: ['service', 'replica', 'state'],
      read: () => tunnels().map(([service, replica, s]) => [{ service, replica, state: s.ready ? 'Ready' : s.reason }, s.ready ? 1 : 0]),
    },
    {
      name: 'tunnel_reconnects_total',
      help: 'Per replica tunnel reconnects.',
      type: 'counter',
      labelNames: ['service', 'replica'],
      read: () => tunnels().map(([service, replica]) => [{ service, replica }, reconnects(replica)]),
    },
    {
      name: 'replica_requests_in_flight',
      help:
        'Per replica: requests and pinned streams (WebSockets) in flight now. A replica removed or ' +
        'replaced stays under its id while its last requests drain.',
      type: 'gauge',
      labelNames: ['service', 'replica'],
      read: () => [...loadsById(replicas).values()].map((l) => [{ service: l.service, replica: l.replica }, l.inFlight]),
    },
    {
      name: 'replica_requests_total',
      help:
        'Per replica id: requests and pinned streams sent to it. A replacement of the id (a new ' +
        'address) continues its count; it starts again from 0 only once the id has left and drained.',
      type: 'counter',
      labelNames: ['service', 'replica'],
      read: () => [...loadsById(replicas).values()].map((l) => [{ service: l.service, replica: l.replica }, l.total]),
    },
  ];
}

/** Per replica object key, its load for /api/v1/status. */
export function replicaLoadStatus(replicas: Replicas): Record<string, { load: ReplicaLoadStatus }> {
  const out: Record<string, { load: ReplicaLoadStatus }> = {};
  for (const [key, l] of loadsById(replicas)) out[key] = { load: { inFlight: l.inFlight, requests: l.total } };
  return out;
}
