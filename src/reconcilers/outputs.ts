// What loops publish for each other: the names of the loops, the keys of their status objects,
// and the typed outputs each one sets on them. A loop reads another loop only through this
// module and the status snapshot, never through the other loop's folder, so the owner of a fact
// can change how it gets it without its readers noticing.

import type { Outputs, StatusSnapshot } from './types.js';

export const SSH_LOOP = 'ssh';
export const TLS_LOOP = 'tls';
export const NGINX_LOOP = 'nginx';

/** The SSH loop's status object of one replica. */
export function replicaObjectKey(serviceKey: string, replicaId: string): string {
  return `${serviceKey}/${replicaId}`;
}

/**
 * The TLS loop's outputs for a domain (object key: the domain). The certificate fields are
 * null while no valid certificate is being served; times are ISO 8601.
 */
export type CertificateOutputs = {
  /** The serving certificate's serial (upper-case hex): part of its published path. */
  serial: string | null;
  certPath: string | null;
  keyPath: string | null;
  notAfter: string | null;
  renewalTime: string | null;
  /** Failed issuance attempts since the last success. */
  failedAttempts: number;
  /** After a failure or a DNS check that failed: no ACME attempt before this; else null. */
  nextAttemptTime: string | null;
  /** What the last failed attempt (certbot, or the DNS check) said, since the last success; else null. */
  lastError: string | null;
};

/** The SSH loop's outputs for a service (object key: the service key): where its balancer listens. */
export type ServiceSocketOutputs = {
  socketPath: string;
};

/** The SSH loop's outputs for a replica (object key: replicaObjectKey). */
export type ReplicaTunnelOutputs = {
  /** Logins to the replica after the first since the process started. */
  reconnects: number;
};

/** The loops part of a status snapshot: all that reading outputs needs. */
type LoopsOf = Pick<StatusSnapshot, 'loops'>;

function outputsOf<T extends Outputs>(statuses: LoopsOf, loop: string, key: string): T | undefined {
  return statuses.loops[loop]?.objects[key]?.outputs as T | undefined;
}

export function certificateOutputs(statuses: LoopsOf, domain: string): CertificateOutputs | undefined {
  return outputsOf<CertificateOutputs>(statuses, TLS_LOOP, domain);
}

export function serviceSocketOutputs(statuses: StatusSnapshot, serviceKey: string): ServiceSocketOutputs | undefined {
  return outputsOf<ServiceSocketOutputs>(statuses, SSH_LOOP, serviceKey);
}

export function replicaTunnelOutputs(statuses: StatusSnapshot, serviceKey: string, replicaId: string): ReplicaTunnelOutputs | undefined {
  return outputsOf<ReplicaTunnelOutputs>(statuses, SSH_LOOP, replicaObjectKey(serviceKey, replicaId));
}
