// statusFor: one answer per failure, wherever it happened; a replica's own words never reach the
// client in a 5xx.

import { describe, expect, it } from 'vitest';
import { DataPlaneError, noReadyReplica, statusFor, type DataPlaneCode } from '../../src/dataplane/errors.js';
import { ERRORS } from '../../src/errors.js';
import { Http1Error, type Http1ErrorCode } from '../../src/http1/index.js';

const SVC = 'proj/svc';
/** What a replica (or a socket error carrying its words) might say: never in the detail. */
const SECRET = 'replica said: token=hunter2 at 10.0.0.7:8000';

describe('statusFor', () => {
  it('maps every data-plane code to its status', () => {
    const cases: [DataPlaneCode, number, string][] = [
      ['DP_ERR_NO_READY_REPLICA', 503, `Service ${SVC} has no ready replica`],
      ['DP_ERR_UPSTREAM_FAILED', 502, ERRORS.DP_ERR_UPSTREAM_FAILED.message],
      ['DP_ERR_UPSTREAM_TIMEOUT', 504, ERRORS.DP_ERR_UPSTREAM_TIMEOUT.message],
      ['DP_ERR_BODY_TOO_LARGE', 413, ERRORS.DP_ERR_BODY_TOO_LARGE.message],
      ['DP_ERR_CLIENT_CLOSED', 499, ERRORS.DP_ERR_CLIENT_CLOSED.message],
      ['DP_ERR_BAD_REQUEST', 400, ERRORS.DP_ERR_BAD_REQUEST.message],
    ];
    for (const [code, status, detail] of cases) {
      const err = new DataPlaneError(code);
      expect(err.status).toBe(status);
      expect(statusFor(err, SVC)).toEqual({ status, code, detail });
    }
  });

  it('keeps the text of a client-side error (the client caused it), not of a 5xx', () => {
    expect(statusFor(new DataPlaneError('DP_ERR_BODY_TOO_LARGE', 'The request body is larger than 1024 bytes'), SVC)).toEqual({
      status: 413,
      code: 'DP_ERR_BODY_TOO_LARGE',
      detail: 'The request body is larger than 1024 bytes',
    });
    expect(statusFor(new DataPlaneError('DP_ERR_BAD_REQUEST', 'bad chunk size'), SVC).detail).toBe('bad chunk size');
    for (const code of ['DP_ERR_UPSTREAM_FAILED', 'DP_ERR_UPSTREAM_TIMEOUT', 'DP_ERR_NO_READY_REPLICA'] as const) {
      const a = statusFor(new DataPlaneError(code, SECRET, { cause: new Error(SECRET) }), SVC);
      expect(a.status).toBeGreaterThanOrEqual(500);
      expect(a.detail).not.toContain('hunter2');
      expect(a.detail).not.toContain('10.0.0.7');
    }
  });

  it('noReadyReplica names the service', () => {
    const err = noReadyReplica('p/s');
    expect(err).toMatchObject({ code: 'DP_ERR_NO_READY_REPLICA', status: 503, message: 'Service p/s has no ready replica' });
    expect(statusFor(err, 'p/s').detail).toBe('Service p/s has no ready replica');
  });

  it('maps the HTTP/1.1 client codes: timeouts 504, aborts 499, the rest 502', () => {
    const cases: [Http1ErrorCode, number, DataPlaneCode][] = [
      ['DP_HTTP1_HEADERS_TIMEOUT', 504, 'DP_ERR_UPSTREAM_TIMEOUT'],
      ['DP_HTTP1_BODY_TIMEOUT', 504, 'DP_ERR_UPSTREAM_TIMEOUT'],
      ['DP_HTTP1_ABORTED', 499, 'DP_ERR_CLIENT_CLOSED'],
      ['DP_HTTP1_CLOSED', 502, 'DP_ERR_UPSTREAM_FAILED'],
      ['DP_HTTP1_BODY_LENGTH', 502, 'DP_ERR_UPSTREAM_FAILED'],
      ['DP_HTTP1_BAD_REQUEST', 502, 'DP_ERR_UPSTREAM_FAILED'],
      ['DP_HTTP1_POOL_CLOSED', 502, 'DP_ERR_UPSTREAM_FAILED'],
    ];
    for (const [code, status, answer] of cases) {
      const a = statusFor(new Http1Error(code, SECRET), SVC);
      expect(a).toEqual({ status, code: answer, detail: ERRORS[answer].message });
      expect(a.detail).not.toContain('hunter2');
    }
  });

  it('socket timeouts are 504; anything unknown is the replica failing (502), never a 500', () => {
    const timedOut = Object.assign(new Error(SECRET), { code: 'ETIMEDOUT' });
    expect(statusFor(timedOut, SVC)).toMatchObject({ status: 504, code: 'DP_ERR_UPSTREAM_TIMEOUT' });
    const unknown: unknown[] = [
      new Error(SECRET),
      Object.assign(new Error(SECRET), { code: 'ECONNRESET' }),
      Object.assign(new Error(SECRET), { code: 'ECONNREFUSED' }),
      Object.assign(new Error(SECRET), { code: 42 }),
      SECRET,
      null,
      undefined,
      { code: 'DP_ERR_SOMETHING_NEW', message: SECRET },
    ];
    for (const err of unknown) {
      expect(statusFor(err, SVC)).toEqual({ status: 502, code: 'DP_ERR_UPSTREAM_FAILED', detail: ERRORS.DP_ERR_UPSTREAM_FAILED.message });
    }
  });
});
