// Each dstack call as one pure change to the document: the current normalised document in, the
// next one (or "nothing to do", or dstack's refusal text) out. No I/O, no clock: the routes
// read the store, call this, validate and write what it returns.
//
// The candidate is built already normalised (objects in normalise()'s key order, lists in its
// sort order), so its hash is right even before the routes re-validate it. Only the lists a
// call changes are copied; every untouched service, project and entrypoint object is shared
// with the current document, which the store treats as immutable. Lookups are binary searches
// on the sorted lists, and the few checks that must see every service (domains, replica ids)
// are one linear pass, so a call costs O(services), never more, on a 20,000-service document.

import {
  API_VERSION,
  KIND,
  LETS_ENCRYPT_PRODUCTION,
  MAX_SERVICES,
  type Acme,
  type Entrypoint,
  type Model,
  type Project,
  type ProxyState,
  type ProxyStateSpec,
  type RateLimit,
  type Replica,
  type Service,
  type SshProxyHop,
} from '../../spec/index.js';
import { compareServices, orderServiceKeys } from '../../spec/normalise.js';
import {
  DSTACK_OWNER,
  type Call,
  type ListServicesResponse,
  type RateLimitRequest,
  type RegisterReplicaRequest,
  type RegisterServiceRequest,
  type SshHopRequest,
} from './calls.js';
import * as texts from './texts.js';

export type Outcome =
  /**
   * `state` is a candidate: the routes validate it as they would a PUT. `probe` is a small
   * document holding only what the call wrote (the services and entrypoints it added or
   * changed, the projects they name, the acme block): when the current document was valid,
   * the candidate is valid exactly when the probe is, because the mapper itself keeps the
   * rules that span the document (one service per name, one owner per domain, replica ids
   * unique, every named project present, the service limit). Validating the probe costs a
   * fraction of a millisecond where the whole candidate costs hundreds on 10,000 services.
   * applyCall always sets it; it is optional so outcomes written by hand (tests) stay valid.
   */
  | { kind: 'changed'; state: ProxyState; probe?: ProxyState }
  /** The document already says what the call asks for: answer 200 and write nothing. */
  | { kind: 'same' }
  /** An expected refusal: 400 with dstack's text. */
  | { kind: 'refused'; detail: string };

const SAME: Outcome = { kind: 'same' };

function refused(detail: string): Outcome {
  return { kind: 'refused', detail };
}

/** What a call wrote, for its probe document. */
interface Written {
  services?: Service[];
  entrypoints?: Entrypoint[];
  /** The projects the written services and entrypoints name. */
  projects?: string[];
}

function changed(current: ProxyState, spec: Partial<ProxyStateSpec>, written: Written = {}): Outcome {
  const state: ProxyState = { apiVersion: API_VERSION, kind: KIND, spec: { ...current.spec, ...spec } };
  const projects: Project[] = [];
  for (const name of new Set(written.projects ?? [])) {
    const at = findProject(state.spec.projects, name);
    const p = at.found ? state.spec.projects[at.index] : undefined;
    if (p) projects.push(p);
  }
  const probe: ProxyState = {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { acme: state.spec.acme, projects, services: written.services ?? [], entrypoints: written.entrypoints ?? [] },
  };
  return { kind: 'changed', state, probe };
}

export function applyCall(current: ProxyState, call: Call): Outcome {
  switch (call.kind) {
    case 'config':
      return applyConfig(current, call.body);
    case 'registerService':
      return registerService(current, call.project, call.body);
    case 'unregisterService':
      return unregisterService(current, call.project, call.run);
    case 'setServiceId':
      return setServiceId(current, call.project, call.run, call.id);
    case 'registerReplica':
      return registerReplica(current, call.project, call.run, call.body);
    case 'unregisterReplica':
      return unregisterReplica(current, call.project, call.run, call.jobId);
    case 'registerEntrypoint':
      return registerEntrypoint(current, call.project, call.body.domain, call.body.https);
  }
}

/** Every service the compatibility routes own, with its replicas: document membership, not readiness. */
export function listServices(state: ProxyState): ListServicesResponse {
  const services: ListServicesResponse['services'] = [];
  for (const s of state.spec.services) {
    if (s.owner !== DSTACK_OWNER) continue;
    services.push({ id: s.id ?? null, project_name: s.project, run_name: s.run, replicas: s.replicas.map((r) => ({ id: r.id })) });
  }
  return { services };
}

/** One line naming the call for logs: names, ids, domains and hosts, never a key. */
export function describeCall(call: Call): string {
  switch (call.kind) {
    case 'config':
      return `config acme_server=${withoutUserinfo(call.body.acme_server) ?? 'default'} eab=${call.body.acme_eab_kid === null ? 'no' : 'yes'}`;
    case 'registerService': {
      const b = call.body;
      const model = b.options.openai ? ` model=${b.options.openai.model.name} (${b.options.openai.model.format})` : '';
      return `register service ${call.project}/${b.run_name} id=${b.id ?? 'none'} domain=${b.domain} https=${b.https} auth=${b.auth}${model}`;
    }
    case 'unregisterService':
      return `unregister service ${call.project}/${call.run}`;
    case 'setServiceId':
      return `set id of service ${call.project}/${call.run} to ${call.id}`;
    case 'registerReplica': {
      const b = call.body;
      const via = [b.ssh_head_proxy, b.ssh_proxy]
        .filter((h): h is SshHopRequest => h !== null)
        .map((h) => ` via ${h.username}@${h.hostname}:${h.port}`)
        .join('');
      return `register replica ${b.job_id} of ${call.project}/${call.run} at ${b.ssh_host}:${b.ssh_port}${via} port ${b.app_port}`;
    }
    case 'unregisterReplica':
      return `unregister replica ${call.jobId} of ${call.project}/${call.run}`;
    case 'registerEntrypoint':
      return `register entrypoint ${call.body.domain} of project ${call.project} https=${call.body.https}`;
  }
}

/** An ACME URL for a log line: credentials written into it (`https://user:pass@host`) are dropped. */
function withoutUserinfo(url: string | null): string | null {
  if (url === null || !url.includes('@')) return url;
  try {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.toString();
  } catch {
    return '(unparsable URL)';
  }
}

// --- config ---------------------------------------------------------------------------------

function applyConfig(
  current: ProxyState,
  body: { acme_server: string | null; acme_eab_kid: string | null; acme_eab_hmac_key: string | null },
): Outcome {
  const old = current.spec.acme;
  const acme: Acme = { server: body.acme_server ?? LETS_ENCRYPT_PRODUCTION };
  if (body.acme_eab_kid !== null) acme.eabKid = body.acme_eab_kid;
  if (body.acme_eab_hmac_key !== null) acme.eabHmacKey = body.acme_eab_hmac_key;
  // The server knows nothing of a contact address: an operator's stays.
  if (old.email !== undefined) acme.email = old.email;
  if (old.server === acme.server && old.eabKid === acme.eabKid && old.eabHmacKey === acme.eabHmacKey) return SAME;
  return changed(current, { acme });
}

// --- services ---------------------------------------------------------------------------------

function registerService(current: ProxyState, project: string, body: RegisterServiceRequest): Outcome {
  const run = body.run_name;
  if (body.router !== null && body.router !== undefined) return refused(texts.ROUTERS_NOT_SUPPORTED);
  const services = current.spec.services;
  const at = findService(services, project, run);
  const old = at.found ? services[at.index] : undefined;
  if (old) {
    // Never take over an operator's service, and a different run under the same name is a
    // race the server resolves by unregistering the old one first.
    if (old.owner !== DSTACK_OWNER) return refused(texts.serviceAlreadyRegistered(project, run));
    if (old.id !== undefined && body.id !== null && old.id !== body.id.toLowerCase())
      return refused(texts.serviceAlreadyRegistered(project, run));
  }
  const domain = body.domain;
  for (const s of services) {
    if (s.domain === domain && s !== old) return refused(texts.domainTaken(domain));
  }
  for (const e of current.spec.entrypoints) {
    if (e.domain === domain) return refused(texts.domainTaken(domain));
  }

  if (!old && services.length >= MAX_SERVICES) {
    return refused(`Cannot register service ${project}/${run}: the gateway already holds ${MAX_SERVICES} services, its limit`);
  }
  const next = buildService(project, body, old);
  const projects = withProjectKey(current.spec.projects, project, body.ssh_private_key);
  if (old && projects === current.spec.projects && JSON.stringify(old) === JSON.stringify(next)) return SAME;
  const nextServices = services.slice();
  if (old) nextServices[at.index] = next;
  else nextServices.splice(at.index, 0, next);
  return changed(current, { projects, services: nextServices }, { services: [next], projects: [project] });
}

/** The service a registration describes, in normalise()'s key order; an existing one keeps its replicas (and its id when none is sent). */
function buildService(project: string, body: RegisterServiceRequest, old: Service | undefined): Service {
  const s: Service = { project, run: body.run_name } as Service;
  const id = body.id === null ? old?.id : body.id.toLowerCase();
  if (id !== undefined) s.id = id;
  s.owner = DSTACK_OWNER;
  s.domain = body.domain;
  if (body.has_router_replica) s.routerAllowlist = true;
  // An operator may have set a read timeout on our service (a document overlay): keep it.
  if (old?.readTimeout !== undefined) s.readTimeout = old.readTimeout;
  s.https = body.https;
  s.auth = body.auth;
  s.clientMaxBodySize = body.client_max_body_size;
  s.stripPrefix = true;
  s.rateLimits = body.rate_limits.map(rateLimit).sort(compareRateLimits);
  const model = body.options.openai?.model;
  if (model) s.model = buildModel(model);
  s.replicas = old ? old.replicas : [];
  return s;
}

function rateLimit(r: RateLimitRequest): RateLimit {
  const key: RateLimit['key'] = r.key.type === 'header' ? { type: 'header', header: r.key.header.toLowerCase() } : { type: 'ipAddress' };
  return { prefix: r.prefix, key, rps: r.rps, burst: r.burst };
}

/** normalise()'s order of rate limits: prefix, key type, header. */
function compareRateLimits(a: RateLimit, b: RateLimit): number {
  const ka = `${a.prefix}\u0000${a.key.type}\u0000${a.key.type === 'header' ? a.key.header : ''}`;
  const kb = `${b.prefix}\u0000${b.key.type}\u0000${b.key.type === 'header' ? b.key.header : ''}`;
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

function buildModel(m: NonNullable<RegisterServiceRequest['options']['openai']>['model']): Model {
  if (m.format === 'openai') return { name: m.name, format: 'openai', prefix: m.prefix };
  return { name: m.name, format: 'tgi', chatTemplate: m.chat_template, eosToken: m.eos_token };
}

function unregisterService(current: ProxyState, project: string, run: string): Outcome {
  const services = current.spec.services;
  const at = findService(services, project, run);
  // Unknown, or an operator's: nothing of ours to remove, and an error would only make the
  // server retry forever.
  if (!at.found || services[at.index]?.owner !== DSTACK_OWNER) return SAME;
  const next = services.slice();
  next.splice(at.index, 1);
  return changed(current, { services: next });
}

function setServiceId(current: ProxyState, project: string, run: string, id: string): Outcome {
  const services = current.spec.services;
  const at = findService(services, project, run);
  const old = at.found ? services[at.index] : undefined;
  if (!old || old.owner !== DSTACK_OWNER) return refused(texts.serviceMissingCannotSetId(project, run));
  const wanted = id.toLowerCase();
  if (old.id === wanted) return SAME;
  if (old.id !== undefined) return refused(texts.serviceAlreadyHasId(project, run));
  const next = services.slice();
  const updated = orderServiceKeys({ ...old, id: wanted });
  next[at.index] = updated;
  return changed(current, { services: next }, { services: [updated], projects: [project] });
}

// --- replicas ---------------------------------------------------------------------------------

function registerReplica(current: ProxyState, project: string, run: string, body: RegisterReplicaRequest): Outcome {
  const services = current.spec.services;
  const at = findService(services, project, run);
  const old = at.found ? services[at.index] : undefined;
  if (!old || old.owner !== DSTACK_OWNER) return refused(texts.serviceMissingCannotRegisterReplica(project, run));
  const id = body.job_id;
  const built = buildReplica(body);
  if (typeof built === 'string') return refused(texts.cannotRegisterReplica(id, project, run, built));

  const existing = findReplica(old.replicas, id);
  if (existing.found) {
    const mine = old.replicas[existing.index];
    if (JSON.stringify(mine) === JSON.stringify(built)) return SAME;
    return refused(texts.replicaAlreadyExists(id, project, run));
  }
  // Replica ids are unique across the document (they key the SSH loop's tunnels).
  for (const s of services) {
    if (s !== old && hasReplica(s.replicas, id)) {
      return refused(texts.cannotRegisterReplica(id, project, run, `replica id ${id} is already used by service ${s.project}/${s.run}`));
    }
  }
  const replicas = old.replicas.slice();
  replicas.splice(existing.index, 0, built);
  const next = services.slice();
  const updated = { ...old, replicas };
  next[at.index] = updated;
  return changed(current, { services: next }, { services: [updated], projects: [project] });
}

/** The replica a registration describes, in normalise()'s key order, or why it cannot be one. */
function buildReplica(body: RegisterReplicaRequest): Replica | string {
  // `user@host`: a user name never holds '@', a host may (an odd IPv6 zone aside, never), so
  // split at the last one, as ssh itself does.
  const atSign = body.ssh_host.lastIndexOf('@');
  if (atSign <= 0 || atSign === body.ssh_host.length - 1) {
    return `ssh_host must be "user@host"; got ${JSON.stringify(body.ssh_host)}`;
  }
  const r: Replica = {
    id: body.job_id,
    appPort: body.app_port,
    // The runner makes fresh host keys for every job container, often behind a reused VM
    // address and port: trust is per replica, not per address.
    hostKeyPolicy: 'tofu-per-replica',
    ssh: { host: body.ssh_host.slice(atSign + 1).toLowerCase(), port: body.ssh_port, user: body.ssh_host.slice(0, atSign) },
  };
  if (body.ssh_proxy) r.sshProxy = proxyHop(body.ssh_proxy, body.ssh_proxy_private_key);
  if (body.ssh_head_proxy) r.sshHeadProxy = proxyHop(body.ssh_head_proxy, body.ssh_head_proxy_private_key);
  return r;
}

/** A null key means the project's key, which is what an absent `privateKey` says. */
function proxyHop(h: SshHopRequest, key: string | null): SshProxyHop {
  const hop: SshProxyHop = { host: h.hostname.toLowerCase(), port: h.port, user: h.username };
  if (key !== null) hop.privateKey = key;
  return hop;
}

function unregisterReplica(current: ProxyState, project: string, run: string, jobId: string): Outcome {
  const services = current.spec.services;
  const at = findService(services, project, run);
  const old = at.found ? services[at.index] : undefined;
  if (!old || old.owner !== DSTACK_OWNER) return SAME;
  const r = findReplica(old.replicas, jobId);
  if (!r.found) return SAME;
  const replicas = old.replicas.slice();
  replicas.splice(r.index, 1);
  const next = services.slice();
  const updated = { ...old, replicas };
  next[at.index] = updated;
  return changed(current, { services: next }, { services: [updated], projects: [project] });
}

// --- entrypoints ------------------------------------------------------------------------------

/**
 * One entrypoint per project, the last writer wins: this project's previous one goes, and so
 * does another project's with the same domain (exported gateways make several projects send
 * the same `gateway.<domain>`; refusing would terminate the run, since the server registers
 * the entrypoint before the service).
 */
function registerEntrypoint(current: ProxyState, project: string, domain: string, https: boolean): Outcome {
  for (const s of current.spec.services) {
    if (s.domain === domain) return refused(texts.domainTaken(domain));
  }
  const old = current.spec.entrypoints;
  const kept = old.filter((e) => e.project !== project && e.domain !== domain);
  const mine = old.filter((e) => e.project === project);
  const projects = withProject(current.spec.projects, project);
  if (
    kept.length === old.length - 1 &&
    mine.length === 1 &&
    mine[0]?.domain === domain &&
    mine[0].https === https &&
    projects === current.spec.projects
  ) {
    return SAME;
  }
  const entry: Entrypoint = { project, domain, https };
  let i = 0;
  while (i < kept.length && (kept[i]?.domain ?? '') < domain) i++;
  kept.splice(i, 0, entry);
  return changed(current, { projects, entrypoints: kept }, { entrypoints: [entry], projects: [project] });
}

// --- projects ---------------------------------------------------------------------------------

/** The projects with `name` holding `key` (added or overwritten); the same array when nothing changes. */
function withProjectKey(projects: Project[], name: string, key: string): Project[] {
  const at = findProject(projects, name);
  if (at.found && projects[at.index]?.sshPrivateKey === key) return projects;
  const next = projects.slice();
  const project: Project = { name, sshPrivateKey: key };
  if (at.found) next[at.index] = project;
  else next.splice(at.index, 0, project);
  return next;
}

/** The projects with `name` present (without a key when it is new); the same array when it was there. */
function withProject(projects: Project[], name: string): Project[] {
  const at = findProject(projects, name);
  if (at.found) return projects;
  const next = projects.slice();
  next.splice(at.index, 0, { name });
  return next;
}

// --- sorted lookups -----------------------------------------------------------------------------

type Position = { found: boolean; index: number };

/** Binary search in a sorted list: where the item is, or where it would be inserted. */
function search<T>(items: readonly T[], compare: (item: T) => number): Position {
  let lo = 0;
  let hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const c = compare(items[mid] as T);
    if (c === 0) return { found: true, index: mid };
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return { found: false, index: lo };
}

function findService(services: readonly Service[], project: string, run: string): Position {
  const key = { project, run };
  return search(services, (s) => compareServices(s, key));
}

function findReplica(replicas: readonly Replica[], id: string): Position {
  return search(replicas, (r) => (r.id < id ? -1 : r.id > id ? 1 : 0));
}

/** findReplica's answer without its allocation: this runs once per service of the document. */
function hasReplica(replicas: readonly Replica[], id: string): boolean {
  let lo = 0;
  let hi = replicas.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const rid = (replicas[mid] as Replica).id;
    if (rid === id) return true;
    if (rid < id) lo = mid + 1;
    else hi = mid;
  }
  return false;
}

function findProject(projects: readonly Project[], name: string): Position {
  return search(projects, (p) => (p.name < name ? -1 : p.name > name ? 1 : 0));
}
