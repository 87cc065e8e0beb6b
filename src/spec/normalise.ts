// Schema-valid input → ProxyState: lower-case names and domains, every default filled in,
// every list sorted by its key, objects built in one fixed key order. Equal intent gives
// byte-equal JSON. normalise(normalise(x)) deep-equals normalise(x).

import type { ProxyStateInput, RateLimitInput, ReplicaInput, ServiceInput } from './input.js';
import {
  API_VERSION,
  DEFAULT_CLIENT_MAX_BODY_SIZE,
  DEFAULT_MODEL_PREFIX,
  DEFAULT_SSH_PORT,
  KIND,
  LETS_ENCRYPT_PRODUCTION,
  type Acme,
  type Entrypoint,
  type Model,
  type Project,
  type ProxyState,
  type RateLimit,
  type Replica,
  type Service,
  type SshHop,
  type SshProxyHop,
} from './types.js';

export function normalise(doc: ProxyStateInput | ProxyState): ProxyState {
  const spec = doc.spec;
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: normaliseAcme(spec.acme ?? {}),
      projects: (spec.projects ?? []).map(normaliseProject).sort(byKey((p) => p.name)),
      services: (spec.services ?? []).map(normaliseService).sort(compareServices),
      entrypoints: (spec.entrypoints ?? [])
        .map((e): Entrypoint => ({ project: e.project.toLowerCase(), domain: e.domain.toLowerCase(), https: e.https ?? true }))
        .sort(byKey((e) => e.domain)),
    },
  };
}

function normaliseAcme(a: Partial<Acme>): Acme {
  const out: Acme = { server: a.server ?? LETS_ENCRYPT_PRODUCTION };
  if (a.eabKid !== undefined) out.eabKid = a.eabKid;
  if (a.eabHmacKey !== undefined) out.eabHmacKey = a.eabHmacKey;
  if (a.email !== undefined) out.email = a.email;
  return out;
}

function normaliseProject(p: Project): Project {
  const out: Project = { name: p.name.toLowerCase() };
  if (p.sshPrivateKey !== undefined) out.sshPrivateKey = p.sshPrivateKey;
  return out;
}

function normaliseService(s: ServiceInput): Service {
  const out: Service = {
    project: s.project.toLowerCase(),
    run: s.run.toLowerCase(),
    https: s.https ?? true,
    auth: s.auth ?? true,
    clientMaxBodySize: s.clientMaxBodySize ?? DEFAULT_CLIENT_MAX_BODY_SIZE,
    stripPrefix: s.stripPrefix ?? true,
    rateLimits: (s.rateLimits ?? []).map(normaliseRateLimit).sort(byKey(rateLimitKey)),
    replicas: (s.replicas ?? []).map(normaliseReplica).sort(byKey((r) => r.id)),
  };
  if (s.id !== undefined) out.id = s.id.toLowerCase();
  if (s.owner !== undefined) out.owner = s.owner;
  if (s.domain !== undefined) out.domain = s.domain.toLowerCase();
  // Written only when on or set, so documents that never use them keep their hash.
  if (s.routerAllowlist === true) out.routerAllowlist = true;
  if (s.readTimeout !== undefined) out.readTimeout = s.readTimeout;
  if (s.model) out.model = normaliseModel(s.model);
  return orderServiceKeys(out);
}

const SERVICE_KEYS = [
  'project',
  'run',
  'id',
  'owner',
  'domain',
  'routerAllowlist',
  'readTimeout',
  'https',
  'auth',
  'clientMaxBodySize',
  'stripPrefix',
  'rateLimits',
  'model',
  'replicas',
] as const;

/** A service with its keys in the normalised order (a spread puts a changed key last). */
export function orderServiceKeys(s: Service): Service {
  return reorder(s, SERVICE_KEYS);
}

function normaliseRateLimit(r: RateLimitInput): RateLimit {
  const key: RateLimit['key'] =
    r.key.type === 'header' ? { type: 'header', header: (r.key.header ?? '').toLowerCase() } : { type: 'ipAddress' };
  return { prefix: r.prefix, key, rps: r.rps, burst: r.burst ?? 0 };
}

function rateLimitKey(r: RateLimit): string {
  return `${r.prefix}\u0000${r.key.type}\u0000${r.key.type === 'header' ? r.key.header : ''}`;
}

function normaliseModel(m: NonNullable<ServiceInput['model']>): Model {
  if (m.format === 'openai') return { name: m.name, format: 'openai', prefix: m.prefix ?? DEFAULT_MODEL_PREFIX };
  const out: Model = { name: m.name, format: 'tgi' };
  if (m.chatTemplate !== undefined) out.chatTemplate = m.chatTemplate;
  if (m.eosToken !== undefined) out.eosToken = m.eosToken;
  if (m.bosToken !== undefined) out.bosToken = m.bosToken;
  return out;
}

function normaliseReplica(r: ReplicaInput): Replica {
  const out: Replica = { id: r.id, appPort: r.appPort };
  if (r.hostKeyPolicy !== undefined && r.hostKeyPolicy !== 'tofu') out.hostKeyPolicy = r.hostKeyPolicy;
  if (r.ssh) out.ssh = normaliseHop(r.ssh);
  if (r.sshProxy) out.sshProxy = normaliseProxyHop(r.sshProxy);
  if (r.sshHeadProxy) out.sshHeadProxy = normaliseProxyHop(r.sshHeadProxy);
  if (r.direct) out.direct = { host: r.direct.host.toLowerCase(), port: r.direct.port };
  return out;
}

function normaliseHop(h: Omit<SshHop, 'port'> & { port?: number }): SshHop {
  const out: SshHop = { host: h.host.toLowerCase(), port: h.port ?? DEFAULT_SSH_PORT, user: h.user };
  if (h.hostKeyFingerprint !== undefined) out.hostKeyFingerprint = h.hostKeyFingerprint;
  return out;
}

function normaliseProxyHop(h: Omit<SshProxyHop, 'port'> & { port?: number }): SshProxyHop {
  const out: SshProxyHop = normaliseHop(h);
  if (h.privateKey !== undefined) out.privateKey = h.privateKey;
  return out;
}

/** The order of services in a normalised document: by project, then run. */
export function compareServices(a: { project: string; run: string }, b: { project: string; run: string }): number {
  if (a.project !== b.project) return a.project < b.project ? -1 : 1;
  return a.run < b.run ? -1 : a.run > b.run ? 1 : 0;
}

function byKey<T>(key: (t: T) => string): (a: T, b: T) => number {
  return (a, b) => {
    const ka = key(a);
    const kb = key(b);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  };
}

function reorder<T extends object>(obj: T, keys: readonly (keyof T)[]): T {
  const out = {} as T;
  for (const k of keys) if (obj[k] !== undefined) out[k] = obj[k];
  return out;
}
