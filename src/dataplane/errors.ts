// What a client is told when its request could not be relayed: one mapping, used by every path
// that answers a client (the balancer sockets behind Nginx, the in-server proxy, its WebSocket
// path, the model API), so one failure has one status and one text wherever it happens.

import { ERRORS, type ErrorCode } from '../errors.js';

export type DataPlaneCode =
  | 'DP_ERR_NO_READY_REPLICA'
  | 'DP_ERR_UPSTREAM_FAILED'
  | 'DP_ERR_UPSTREAM_TIMEOUT'
  | 'DP_ERR_BODY_TOO_LARGE'
  | 'DP_ERR_CLIENT_CLOSED'
  | 'DP_ERR_BAD_REQUEST';

/** A data-plane failure with its catalog code; `status` follows from the code. */
export class DataPlaneError extends Error {
  readonly status: number;

  constructor(
    readonly code: DataPlaneCode & ErrorCode,
    message?: string,
    options?: { cause?: unknown },
  ) {
    super(message ?? ERRORS[code].message, options);
    this.name = 'DataPlaneError';
    this.status = ERRORS[code].status;
  }
}

export function noReadyReplica(serviceKey: string): DataPlaneError {
  return new DataPlaneError('DP_ERR_NO_READY_REPLICA', `Service ${serviceKey} has no ready replica`);
}

export interface ClientAnswer {
  status: number;
  code: DataPlaneCode;
  /** The `{"detail": …}` text: dstack's wording where dstack has one. Never a replica's or a key's text. */
  detail: string;
}

/** Error codes of the HTTP/1.1 client and of sockets that mean the replica was too slow. */
const TIMEOUTS = new Set(['DP_HTTP1_HEADERS_TIMEOUT', 'DP_HTTP1_BODY_TIMEOUT', 'DP_UPSTREAM_CONNECT_TIMEOUT', 'ETIMEDOUT']);

/**
 * The answer for a request that failed before any response byte reached the client. Anything
 * not known here is the replica's failure (502): a client never gets a 500 for what a replica did.
 */
export function statusFor(err: unknown, serviceKey: string): ClientAnswer {
  const code = typeof err === 'object' && err !== null && 'code' in err ? String((err as { code: unknown }).code) : '';
  switch (code) {
    case 'DP_ERR_NO_READY_REPLICA':
      return { status: 503, code, detail: `Service ${serviceKey} has no ready replica` };
    case 'DP_ERR_BODY_TOO_LARGE':
    case 'DP_ERR_BAD_REQUEST':
    case 'DP_ERR_CLIENT_CLOSED':
      return { status: ERRORS[code].status, code, detail: (err as Error).message };
    case 'DP_ERR_UPSTREAM_TIMEOUT':
      return { status: 504, code, detail: ERRORS[code].message };
  }
  if (TIMEOUTS.has(code)) return { status: 504, code: 'DP_ERR_UPSTREAM_TIMEOUT', detail: ERRORS.DP_ERR_UPSTREAM_TIMEOUT.message };
  if (code === 'DP_HTTP1_ABORTED' || code === 'DP_CLIENT_CLOSED')
    return { status: 499, code: 'DP_ERR_CLIENT_CLOSED', detail: ERRORS.DP_ERR_CLIENT_CLOSED.message };
  return { status: 502, code: 'DP_ERR_UPSTREAM_FAILED', detail: ERRORS.DP_ERR_UPSTREAM_FAILED.message };
}
