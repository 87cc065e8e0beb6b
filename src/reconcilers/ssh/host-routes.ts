// Which services the data plane routes by Host, for requests our default server relays before
// a service's own site is served, and which hosts the document has at all.

import { DEFAULT_CLIENT_MAX_BODY_SIZE, serviceKey, type ProxyState, type Service } from '../../spec/types.js';

/**
 * The services our default server may relay by Host before their own site is served: those
 * whose site would add nothing to the relay — plain HTTP (no certificate to redirect to), no
 * token to check, no rate limit, no router allowlist, no CORS (an OpenAI-format model), the default body limit
 * and read timeout (what the default server sets).
 * Any other waits for its site, and its host answers 404 until then, as it did before.
 */
export function byHostEligible(s: Service): boolean {
  return (
    s.domain !== undefined &&
    !s.https &&
    !s.auth &&
    s.rateLimits.length === 0 &&
    s.routerAllowlist !== true &&
    s.model?.format !== 'openai' &&
    s.clientMaxBodySize === DEFAULT_CLIENT_MAX_BODY_SIZE &&
    s.readTimeout === undefined
  );
}

/** By-host routes the document asks for: service key → its domain in lower case, as Nginx's $host. */
export function hostRoutesOf(spec: ProxyState): Map<string, string> {
  const out = new Map<string, string>();
  for (const s of spec.spec.services) if (byHostEligible(s)) out.set(serviceKey(s), s.domain!.toLowerCase());
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
