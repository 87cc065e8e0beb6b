// Errors of the model API. Bodies are understood by both kinds of client: dstack's (which read
// `detail`) and the OpenAI SDKs (which read `error.message` and map the status to a class).

export type ModelErrorType =
  | 'invalid_request_error'
  | 'permission_error'
  | 'not_found_error'
  | 'upstream_error'
  | 'server_error'
  | 'timeout_error';

export interface ModelErrorBody {
  detail: string;
  error: { message: string; type: ModelErrorType; code: number | null };
}

export class ModelApiError extends Error {
  readonly status: number;
  readonly type: ModelErrorType;
  /** What dstack clients read; defaults to the message. */
  readonly detail: string;

  constructor(status: number, message: string, options?: { type?: ModelErrorType; detail?: string; cause?: unknown }) {
    super(message, { cause: options?.cause });
    this.name = 'ModelApiError';
    this.status = status;
    this.type = options?.type ?? typeForStatus(status);
    this.detail = options?.detail ?? message;
  }

  body(): ModelErrorBody {
    return { detail: this.detail, error: { message: this.message, type: this.type, code: this.status } };
  }
}

export function typeForStatus(status: number): ModelErrorType {
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 504) return 'timeout_error';
  if (status === 502 || status === 503) return 'upstream_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

export function unauthorized(project: string): ModelApiError {
  return new ModelApiError(403, `Unauthenticated or unauthorized to access project ${project}`);
}

export function invalidField(field: string, problem: string): ModelApiError {
  return new ModelApiError(422, `Invalid request body: ${field} ${problem}`);
}

/** Error codes of the forwarders' HTTP clients (undici, src/http1) and sockets that mean a timeout. */
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT', 'DP_HTTP1_HEADERS_TIMEOUT', 'DP_HTTP1_BODY_TIMEOUT', 'ETIMEDOUT']);

/** Any error as a ModelApiError: network failures of the forwarder become 502/504, the rest 500. */
export function toModelError(err: unknown): ModelApiError {
  if (err instanceof ModelApiError) return err;
  const code = typeof err === 'object' && err !== null && 'code' in err ? String((err as { code: unknown }).code) : '';
  const message = err instanceof Error ? err.message : String(err);
  if (TIMEOUT_CODES.has(code)) {
    return new ModelApiError(504, `Timed out requesting model: ${message}`, { cause: err });
  }
  if (code.startsWith('UND_ERR') || code.startsWith('DP_HTTP1_') || code.startsWith('E')) {
    return new ModelApiError(502, `Error requesting model: ${message}`, { cause: err });
  }
  return new ModelApiError(500, 'Internal error', { cause: err });
}

/**
 * The message inside a replica's error body: OpenAI's `error.message`, TGI's `error`, dstack's
 * `detail`, else the text itself.
 */
export function upstreamMessage(text: string): string {
  try {
    const v: unknown = JSON.parse(text);
    if (typeof v === 'object' && v !== null) {
      const o = v as Record<string, unknown>;
      const e = o.error;
      if (typeof e === 'string') return e;
      if (typeof e === 'object' && e !== null && typeof (e as Record<string, unknown>).message === 'string') {
        return (e as Record<string, string>).message!;
      }
      if (typeof o.detail === 'string') return o.detail;
      if (typeof o.message === 'string') return o.message;
    }
  } catch {
    // not JSON: the text is the message
  }
  return text;
}
