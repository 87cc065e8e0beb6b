// Project-member checks against the control server.
//
// createControlServerAuth() asks `POST <serverUrl>/api/projects/<project>/get` with the caller's
// bearer token, exactly as dstack's server answers it: 200 = member, 401/403 = not. Positive
// answers are cached (keyed by sha256 of project and token, never the token itself); anything
// else the server says, a network error or a timeout is `unavailable`: denied, not cached.
// The server is reached at an http(s) URL, one Unix socket, or any live socket of a directory
// (`unix-dir:`, one per server process, as dstack's server forwards them; see socket-dir.ts).
// The model API reuses the same provider.

import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { Agent, request, type Dispatcher } from 'undici';
import { ProxyError } from '../errors.js';
import { systemClock, type Clock } from '../clock.js';
import { PROJECT_PATTERN } from '../spec/schema.js';
import { NoSocketAnswered, SocketDir } from './socket-dir.js';

export type AuthDecision = 'allow' | 'deny' | 'unauthenticated' | 'unavailable';

export interface AuthProvider {
  /** Is `token` the bearer token of a member of `project`? */
  check(project: string, token: string): Promise<AuthDecision>;
  close(): Promise<void>;
}

export interface ControlServerAuthOptions {
  /**
   * `http(s)://host[:port][/base]`, `unix:/path/to.sock`, or `unix-dir:/path/to/dir` (any live
   * `*.sock` in it: dstack's server forwards one per server process over SSH).
   */
  serverUrl: string;
  /** How long a positive answer is reused. Default 60 s. */
  ttlMs?: number;
  /** How long one question to the server may take before the answer is `unavailable`. Default 5 s. */
  timeoutMs?: number;
  /** Most cached answers kept; the oldest go first. Default 10,000. */
  maxEntries?: number;
  clock?: Clock;
  logger?: Logger;
  /** unix-dir: shuffles the sockets; in [0, 1), as Math.random. */
  random?: () => number;
}

export const DEFAULT_AUTH_TTL_MS = 60_000; // 60 s
export const DEFAULT_AUTH_TIMEOUT_MS = 5_000; // 5 s
export const DEFAULT_AUTH_CACHE_ENTRIES = 10_000;

/**
 * Project names the document accepts (dstack's, a leading '-' or '_' included). No '.', so a
 * name cannot be a dot segment of the URL path; it is percent-encoded all the same.
 */
const PROJECT_RE = new RegExp(PROJECT_PATTERN);

/** Where to send the question: an origin + base path, and how a request gets there. */
interface Target {
  origin: string;
  base: string;
  /** Runs `attempt` with a dispatcher that reaches the server; rejects when nothing answered. */
  send<T>(attempt: (dispatcher: Dispatcher) => Promise<T>, signal: AbortSignal): Promise<T>;
  close(): Promise<void>;
}

function oneDispatcher(origin: string, base: string, dispatcher: Agent): Target {
  return { origin, base, send: (attempt) => attempt(dispatcher), close: () => dispatcher.close() };
}

function target(serverUrl: string, o: { clock: Clock; logger: Logger | undefined; timeoutMs: number; random?: () => number }): Target {
  if (serverUrl.startsWith('unix-dir:')) {
    const dir = serverUrl.slice('unix-dir:'.length).replace(/(?<=.)\/+$/, '');
    if (!dir.startsWith('/')) {
      throw new ProxyError('DP_ERR_BAD_OPTION', `--server-url unix-dir: needs an absolute directory path, got ${serverUrl}`);
    }
    const sockets = new SocketDir({
      dir,
      clock: o.clock,
      connectTimeoutMs: o.timeoutMs,
      ...(o.logger ? { logger: o.logger } : {}),
      ...(o.random ? { random: o.random } : {}),
    });
    return { origin: 'http://localhost', base: '', send: (attempt, signal) => sockets.send(attempt, signal), close: () => sockets.close() };
  }
  if (serverUrl.startsWith('unix:')) {
    const socketPath = serverUrl.slice('unix:'.length);
    if (!socketPath.startsWith('/')) {
      throw new ProxyError('DP_ERR_BAD_OPTION', `--server-url unix: needs an absolute socket path, got ${serverUrl}`);
    }
    return oneDispatcher('http://localhost', '', new Agent({ connect: { socketPath } }));
  }
  let url: URL;
  try {
    url = new URL(serverUrl);
  } catch {
    throw new ProxyError('DP_ERR_BAD_OPTION', `--server-url must be an http(s):// URL, unix:/path or unix-dir:/dir, got ${serverUrl}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ProxyError('DP_ERR_BAD_OPTION', `--server-url must be an http(s):// URL, unix:/path or unix-dir:/dir, got ${serverUrl}`);
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new ProxyError('DP_ERR_BAD_OPTION', '--server-url must not carry credentials, a query or a fragment');
  }
  return oneDispatcher(url.origin, url.pathname.replace(/\/+$/, ''), new Agent());
}

function positiveInt(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0) throw new ProxyError('DP_ERR_BAD_OPTION', `${name} must be a non-negative integer, got ${v}`);
  return v;
}

/** The cache key: a hash of project and token, so no token is kept in memory longer than a request. */
export function cacheKey(project: string, token: string): string {
  return createHash('sha256').update(project).update('\0').update(token).digest('hex');
}

export function createControlServerAuth(o: ControlServerAuthOptions): AuthProvider {
  const ttlMs = positiveInt('auth cache TTL', o.ttlMs ?? DEFAULT_AUTH_TTL_MS);
  const timeoutMs = positiveInt('auth timeout', o.timeoutMs ?? DEFAULT_AUTH_TIMEOUT_MS);
  const maxEntries = positiveInt('auth cache size', o.maxEntries ?? DEFAULT_AUTH_CACHE_ENTRIES);
  const clock = o.clock ?? systemClock;
  const to = target(o.serverUrl, { clock, logger: o.logger, timeoutMs, ...(o.random ? { random: o.random } : {}) });
  /** key → expiry (ms since epoch). Insertion order = age, for eviction. */
  const cache = new Map<string, number>();
  /** One question in flight per key: a burst of requests with a new token asks once. */
  const inflight = new Map<string, Promise<AuthDecision>>();

  async function ask(project: string, token: string): Promise<AuthDecision> {
    const url = `${to.origin}${to.base}/api/projects/${encodeURIComponent(project)}/get`;
    // One budget for the whole check, however many sockets it tries.
    const signal = AbortSignal.timeout(timeoutMs);
    try {
      const status = await to.send(async (dispatcher) => {
        const res = await request(url, {
          method: 'POST',
          dispatcher,
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
          body: '{}',
          signal,
          headersTimeout: timeoutMs,
          bodyTimeout: timeoutMs,
        });
        await res.body.dump();
        return res.statusCode;
      }, signal);
      if (status === 200) return 'allow';
      if (status === 401 || status === 403) return 'deny';
      // 404 is what dstack answers for a project the caller cannot see.
      if (status === 404) return 'deny';
      o.logger?.warn({ project, status }, 'control server answered the auth check with an unexpected status');
      return 'unavailable';
    } catch (err) {
      // The socket directory logs its own changes, once each, not once per refused request.
      if (err instanceof NoSocketAnswered) return 'unavailable';
      o.logger?.warn({ project, err: err instanceof Error ? err.message : String(err) }, 'control server unreachable for the auth check');
      return 'unavailable';
    }
  }

  return {
    async check(project: string, token: string): Promise<AuthDecision> {
      if (token === '') return 'unauthenticated';
      if (!PROJECT_RE.test(project)) return 'deny';
      const key = cacheKey(project, token);
      const expires = cache.get(key);
      if (expires !== undefined) {
        if (clock.now() < expires) return 'allow';
        cache.delete(key);
      }
      let pending = inflight.get(key);
      if (!pending) {
        pending = ask(project, token).finally(() => inflight.delete(key));
        inflight.set(key, pending);
      }
      const decision = await pending;
      if (decision === 'allow' && ttlMs > 0) {
        cache.delete(key);
        cache.set(key, clock.now() + ttlMs);
        while (cache.size > maxEntries) {
          const oldest = cache.keys().next().value;
          if (oldest === undefined) break;
          cache.delete(oldest);
        }
      }
      return decision;
    },
    async close(): Promise<void> {
      cache.clear();
      await to.close();
    },
  };
}

/** For a gateway started without --server-url: every protected request is refused. */
export const noServerAuth: AuthProvider = {
  check: async (_project, token) => (token === '' ? 'unauthenticated' : 'unavailable'),
  close: async () => undefined,
};
