// The checks every proxied request passes before a replica is asked, in dstack's order:
// service lookup (404 before auth, as dstack) → proxy auth (403) → the router allowlist (403) →
// rate limits (429) → body size (413). Shared by HTTP requests and WebSocket upgrades.

import type { IncomingHttpHeaders } from 'node:http';
import { bearerToken, type AuthDecision } from '../auth/index.js';
import type { ProxyState, Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { ROUTER_PATH_REFUSED, routerPathAllowed, type ProxyTarget } from './paths.js';
import type { RateLimiter } from './rate-limit.js';

export type Authorize = (project: string, token: string) => Promise<AuthDecision>;

export type Admission =
  { ok: true; service: Service; key: string } | { ok: false; status: number; detail: string; headers?: Record<string, string> };

/** A service index rebuilt when getState() returns a new document object. */
export class ServiceIndex {
  #state: ProxyState | undefined;
  #byKey = new Map<string, Service>();
  readonly #onChange: (services: readonly Service[]) => void;

  constructor(
    private readonly getState: () => ProxyState,
    onChange: (services: readonly Service[]) => void = () => undefined,
  ) {
    this.#onChange = onChange;
  }

  get(key: string): Service | undefined {
    const state = this.getState();
    if (state !== this.#state) {
      this.#state = state;
      this.#byKey = new Map(state.spec.services.map((s) => [serviceKey(s), s]));
      this.#onChange(state.spec.services);
    }
    return this.#byKey.get(key);
  }
}

/** What admit() reads of a request; headers are looked up only when a check needs them. */
export interface AdmitRequest {
  readonly headers: IncomingHttpHeaders;
  /** The declared body length when known without the header object (raw fast path; -1 for none). */
  readonly contentLength?: number;
}

export interface AdmitContext {
  index: ServiceIndex;
  authorize: Authorize;
  limiter: RateLimiter;
}

/** Synchronous unless the service uses proxy auth (then the control server may be asked). */
export function admit(ctx: AdmitContext, t: ProxyTarget, req: AdmitRequest, clientIp: string): Admission | Promise<Admission> {
  const key = serviceKey(t);
  const service = ctx.index.get(key);
  if (!service || service.replicas.length === 0) return { ok: false, status: 404, detail: `Service ${key} not found` };
  if (!service.auth) return limits(ctx, t, req, clientIp, service, key);
  const token = bearerToken(req.headers.authorization);
  if (token === null) return forbidden(service);
  return ctx.authorize(service.project, token).then((decision): Admission => {
    if (decision === 'unavailable') {
      return { ok: false, status: 503, detail: `Cannot verify access to project ${service.project} now; try again` };
    }
    if (decision !== 'allow') return forbidden(service);
    return limits(ctx, t, req, clientIp, service, key);
  });
}

function forbidden(service: Service): Admission {
  return { ok: false, status: 403, detail: `Unauthenticated or unauthorized to access project ${service.project}` };
}

/** The router allowlist (403), rate limits (429), then the declared body size (413). */
function limits(ctx: AdmitContext, t: ProxyTarget, req: AdmitRequest, clientIp: string, service: Service, key: string): Admission {
  // A refused path takes no rate-limit token: it never reaches a replica.
  if (service.routerAllowlist === true && !routerPathAllowed(t.match || '/')) {
    return { ok: false, status: 403, detail: ROUTER_PATH_REFUSED };
  }
  if (service.rateLimits.length > 0) {
    const headers = req.headers;
    const allowed = ctx.limiter.allow(key, service.rateLimits, {
      path: t.match || '/',
      clientIp,
      header: (name) => {
        const v = headers[name.toLowerCase()];
        return Array.isArray(v) ? v.join(', ') : v;
      },
    });
    if (!allowed) return { ok: false, status: 429, detail: 'Too many requests' };
  }

  const limit = service.clientMaxBodySize;
  const length = req.contentLength ?? req.headers['content-length'];
  if (limit > 0 && length !== undefined && Number(length) > limit) {
    return { ok: false, status: 413, detail: `Request body is larger than ${limit} bytes` };
  }
  return { ok: true, service, key };
}
