// The one error catalog: every error the gateway reports carries a stable code and an HTTP
// status. test/errors.test.ts checks that each code is documented in docs/errors.md.

export interface ErrorDef {
  status: number;
  message: string;
}

export const ERRORS = {
  DP_ERR_INVALID_DOCUMENT: { status: 422, message: 'The document is invalid' },
  DP_ERR_MALFORMED_DOCUMENT: { status: 400, message: 'The document could not be parsed' },
  DP_ERR_DOCUMENT_TOO_LARGE: { status: 413, message: 'The document is larger than the limit' },
  DP_ERR_UNSUPPORTED_MEDIA_TYPE: { status: 415, message: 'Unsupported content type' },
  DP_ERR_GENERATION_MISMATCH: { status: 409, message: 'If-Match does not name the current generation' },
  DP_ERR_BAD_IF_MATCH: { status: 400, message: 'If-Match must be a generation number' },
  DP_ERR_UNAUTHORIZED: { status: 401, message: 'A valid API token is required' },
  DP_ERR_FORBIDDEN: { status: 403, message: 'Access denied' },
  DP_ERR_NOT_FOUND: { status: 404, message: 'Not found' },
  DP_ERR_NOT_READY: { status: 503, message: 'The gateway has not finished its first reconcile' },
  DP_ERR_STATE_CORRUPT: { status: 500, message: 'The state file is corrupt' },
  DP_ERR_STATE_UNAVAILABLE: { status: 503, message: 'The state database is unreachable' },
  DP_ERR_STATE_WRITE: { status: 503, message: 'The state could not be written (disk full, read-only or no permission)' },
  DP_ERR_INTERNAL: { status: 500, message: 'Internal error' },
  DP_ERR_BAD_OPTION: { status: 500, message: 'Invalid option' },
  DP_ERR_OPEN_API: { status: 500, message: 'The management API would be open on a non-loopback address' },
  DP_ERR_ALREADY_SERVED: { status: 500, message: 'Another gateway serves this state dir' },
  DP_ERR_MANAGEMENT_OFF: { status: 403, message: 'The management routes are not served on this listener' },
  DP_ERR_DUPLICATE_HOST: { status: 400, message: 'The request has more than one Host header' },
  DP_ERR_NO_READY_REPLICA: { status: 503, message: 'The service has no ready replica' },
  DP_ERR_UPSTREAM_FAILED: { status: 502, message: 'Error requesting upstream' },
  DP_ERR_UPSTREAM_TIMEOUT: { status: 504, message: 'Timed out requesting upstream' },
  DP_ERR_BODY_TOO_LARGE: { status: 413, message: 'The request body is larger than the limit' },
  DP_ERR_CLIENT_CLOSED: { status: 499, message: 'The client closed the connection' },
  DP_ERR_BAD_REQUEST: { status: 400, message: 'The request could not be parsed' },
} as const satisfies Record<string, ErrorDef>;

export type ErrorCode = keyof typeof ERRORS;

export class ProxyError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message?: string, details?: Record<string, unknown>, options?: { cause?: unknown }) {
    super(message ?? ERRORS[code].message, options);
    this.name = 'ProxyError';
    this.code = code;
    this.status = ERRORS[code].status;
    this.details = details;
  }

  toJSON(): Record<string, unknown> {
    return { code: this.code, message: this.message, ...this.details };
  }
}

/** A reconcile error that retrying will not fix (a TerminalError means "don't retry"). */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'TerminalError';
  }
}
