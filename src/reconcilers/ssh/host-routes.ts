// Which services the data plane routes by Host, for requests our default server relays before
// a service's own site is served, and which hosts the document has at all.

import type { HostRoute } from '../../dataplane/service-header.js';
import { servesCors } from '../../spec/cors.js';
import { DEFAULT_CLIENT_MAX_BODY_SIZE, serviceKey, type ProxyState, type Service } from '../../spec/types.js';

/**
 * The services our default server may relay by Host before their own site is served: those
 * whose site adds nothing the relay and the data plane do not do alike — plain HTTP (no
 * certificate to redirect to), no rate limit, no router allowlist, the default body limit and
 * read timeout (what the default server sets). A token check (`auth`) is the default server's
 * by-host auth check, an OpenAI-format model's CORS its headers and the data plane's preflight
 * answer (HostRoute). Any other waits for its site, and its host answers 404 until then.
 */
export function byHostEligible(s: Service): boolean {
  return (
    s.domain !== undefined &&
    !s.https &&
    s.rateLimits.length === 0 &&
    s.routerAllowlist !== true &&
    s.clientMaxBodySize === DEFAULT_CLIENT_MAX_BODY_SIZE &&
    s.readTimeout === undefined
  );
}

/** The by-host route of an eligible service (its domain in lower case, as Nginx's $host). */
export function hostRouteOf(s: Service): HostRoute {
  return { host: s.domain!.toLowerCase(), cors: servesCors(s), auth: s.auth };
}

/** By-host routes the document asks for, by service key. */
export function hostRoutesOf(spec: ProxyState): Map<string, HostRoute> {
  const out = new Map<string, HostRoute>();
  for (const s of spec.spec.services) if (byHostEligible(s)) out.set(serviceKey(s), hostRouteOf(s));
  return out;
}

const domainSets = new WeakMap<readonly Service[], ReadonlySet<string>>();

/** Every service's domain in lower case, once per services list (a document that changed builds a new list). */
export function domainsOf(spec: ProxyState): ReadonlySet<string> {
  const services = spec.spec.services;
  let out = domainSets.get(services);
  if (out === undefined) {
    const set = new Set<string>();
    for (const s of services) if (s.domain !== undefined) set.add(s.domain.toLowerCase());
    domainSets.set(services, (out = set));
  }
  return out;
}
