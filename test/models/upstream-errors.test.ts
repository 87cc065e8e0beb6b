// How a replica's (or Nginx's) non-2xx answer reaches an OpenAI client: JSON errors keep their
// status and message; an HTML page never does — Nginx's "no site for this Host" (404) and "no
// upstream to reach" (502/503) pages mean the model is not served yet, a 503.

import { describe, expect, it } from 'vitest';
import { DataPlaneError, noReadyReplica } from '../../src/dataplane/errors.js';
import { toModelError, upstreamError } from '../../src/models/errors.js';

const NGINX_404 =
  '<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n';
const NGINX_502 = NGINX_404.replace(/404 Not Found/g, '502 Bad Gateway');

describe('upstreamError', () => {
  it.each<[string, number, string | undefined, string, number, RegExp]>([
    ['a JSON error of the replica', 400, 'application/json', '{"error":{"message":"bad max_tokens"}}', 400, /^bad max_tokens$/],
    ['a plain-text error of the replica', 500, 'text/plain', 'out of memory', 500, /^out of memory$/],
    ["Nginx's 404 page (no site for the Host)", 404, 'text/html', NGINX_404, 503, /acme\/m is not available: its site is not live/],
    ["Nginx's 502 page (no balancer yet)", 502, 'text/html', NGINX_502, 503, /acme\/m is not available: it has no ready replica/],
    ['an HTML page without a content type', 404, undefined, NGINX_404, 503, /not live/],
    ['another HTML page', 500, 'text/html; charset=utf-8', '<!DOCTYPE html><p>oops</p>', 500, /answered 500 with an HTML page/],
  ])('%s', (_name, status, type, text, want, message) => {
    const e = upstreamError('acme/m', status, type, text);
    expect(e.status).toBe(want);
    expect(e.message).toMatch(message);
    expect(JSON.stringify(e.body())).not.toMatch(type === 'text/html' || type === undefined ? /<|nginx/ : /<html/);
  });

  it.each<[string, string, string]>([
    [
      "the router allowlist's refusal (dstack's `detail`)",
      '{"detail":"Path is not allowed for this service"}',
      'Path is not allowed for this service',
    ],
    ["an OpenAI replica's error", '{"error":{"message":"bad max_tokens","type":"invalid_request_error"}}', 'bad max_tokens'],
    ["TGI's error", '{"error":"Input validation error","error_type":"validation"}', 'Input validation error'],
    ['plain text', 'quota exceeded', 'quota exceeded'],
  ])('relays the words of %s once, as a string in both detail and error.message', (_name, text, words) => {
    const body = upstreamError('acme/m', 403, 'application/json', text).body();
    expect(body).toEqual({ detail: words, error: { message: words, type: 'permission_error', code: 403 } });
  });
});

describe('toModelError', () => {
  it('keeps the status an error carries (the balancer: no ready replica, 503), also as a cause', () => {
    const noReady = Object.assign(new Error('Service main/x has no ready replica'), { status: 503 });
    expect(toModelError(noReady)).toMatchObject({ status: 503, message: 'Service main/x has no ready replica', type: 'upstream_error' });
    expect(toModelError(new Error('connect failed', { cause: noReady })).status).toBe(503);
    expect(toModelError(Object.assign(new Error('refused'), { code: 'ECONNREFUSED' })).status).toBe(502);
    expect(toModelError(new Error('a bug')).status).toBe(500);
  });

  it("gives the data plane's failures the catalog's status and text (statusFor), also as a cause", () => {
    expect(toModelError(noReadyReplica('main/x'), 'main/x')).toMatchObject({
      status: 503,
      message: 'Service main/x has no ready replica',
      type: 'upstream_error',
    });
    expect(toModelError(new Error('wrapped', { cause: noReadyReplica('main/x') }), 'main/x').status).toBe(503);
    expect(toModelError(noReadyReplica('main/x')).message).toBe('Service main/x has no ready replica');
    const timeout = toModelError(new DataPlaneError('DP_ERR_UPSTREAM_TIMEOUT'), 'main/x');
    expect(timeout).toMatchObject({ status: 504, message: 'Timed out requesting upstream', type: 'timeout_error' });
    const failed = toModelError(
      new DataPlaneError('DP_ERR_UPSTREAM_FAILED', 'every Ready replica of main/x failed: ECONNREFUSED'),
      'main/x',
    );
    expect(failed).toMatchObject({ status: 502, message: 'Error requesting upstream' });
  });
});
