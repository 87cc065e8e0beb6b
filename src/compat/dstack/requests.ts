// dstack's request models, checked the way its gateway (FastAPI on pydantic v2) checks them:
// required fields, types with pydantic's lax conversions (a numeric string is an int, 1 is
// true), literals, discriminated unions and the two injection patterns. Unknown fields are
// dropped at every level, so a newer server's additions never break us. A request that fails
// gets the errors FastAPI would put in a 422 `{"detail": [...]}`: every error, in field order,
// each `{type, loc: ['body', …], msg, input, ctx?}`. Names the router lower-cases (project,
// run name, domain) come out lower-cased; job ids are left as sent.

import type {
  Call,
  ChatModelRequest,
  ConfigRequest,
  RateLimitRequest,
  RegisterEntrypointRequest,
  RegisterReplicaRequest,
  RegisterServiceRequest,
  SshHopRequest,
} from './calls.js';

export type CallKind = Call['kind'];

/** Path parameters as the routes matched them (URL-decoded), named as in our routes. */
export interface PathParams {
  project?: string;
  run?: string;
  jobId?: string;
}

/** One element of FastAPI's 422 `detail` array. */
export interface ValidationErrorItem {
  type: string;
  loc: (string | number)[];
  msg: string;
  input: unknown;
  ctx?: Record<string, unknown>;
}

export type ParseResult = { ok: true; call: Call } | { ok: false; detail: ValidationErrorItem[] };

/** `RateLimit.prefix` and the header key's pattern, as dstack's gateway declares them. */
export const DSTACK_PREFIX_PATTERN = String.raw`^/[^\s\\{}]*$`;
export const DSTACK_HEADER_PATTERN = String.raw`^[a-zA-Z0-9-_]+$`;
const PREFIX_RE = new RegExp(DSTACK_PREFIX_PATTERN, 'u');
const HEADER_RE = new RegExp(DSTACK_HEADER_PATTERN, 'u');

type Loc = (string | number)[];
type Obj = Record<string, unknown>;

/** Collects errors; every check returns undefined when it failed, so callers just test the value. */
class Errors {
  readonly items: ValidationErrorItem[] = [];
  add(type: string, loc: Loc, msg: string, input: unknown, ctx?: Record<string, unknown>): undefined {
    const item: ValidationErrorItem = { type, loc, msg, input };
    if (ctx) item.ctx = ctx;
    this.items.push(item);
    return undefined;
  }
}

const MISSING = Symbol('missing');

function get(obj: Obj, key: string): unknown {
  return Object.hasOwn(obj, key) ? obj[key] : MISSING;
}

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// --- scalar checks, each with pydantic v2's error type and message --------------------------

function model(e: Errors, v: unknown, loc: Loc): Obj | undefined {
  if (isObj(v)) return v;
  return e.add('model_attributes_type', loc, 'Input should be a valid dictionary or object to extract fields from', v);
}

function str(e: Errors, v: unknown, loc: Loc, coerceNumbers = false): string | undefined {
  if (typeof v === 'string') return v;
  // dstack's own models (SSH hops) set coerce_numbers_to_str.
  if (coerceNumbers && typeof v === 'number' && Number.isFinite(v)) return String(v);
  return e.add('string_type', loc, 'Input should be a valid string', v);
}

function patterned(e: Errors, v: unknown, loc: Loc, re: RegExp, source: string): string | undefined {
  const s = str(e, v, loc);
  if (s === undefined) return undefined;
  if (re.test(s)) return s;
  return e.add('string_pattern_mismatch', loc, `String should match pattern '${source}'`, v, { pattern: source });
}

function int(e: Errors, v: unknown, loc: Loc): number | undefined {
  if (typeof v === 'number') {
    if (Number.isInteger(v)) return v;
    if (Number.isFinite(v)) return e.add('int_from_float', loc, 'Input should be a valid integer, got a number with a fractional part', v);
    return e.add('finite_number', loc, 'Input should be a finite number', v);
  }
  if (typeof v === 'boolean') return v ? 1 : 0;
  if (typeof v === 'string') {
    const t = v.trim().replaceAll('_', '');
    if (/^[+-]?\d+$/.test(t)) return Number(t);
    return e.add('int_parsing', loc, 'Input should be a valid integer, unable to parse string as an integer', v);
  }
  return e.add('int_type', loc, 'Input should be a valid integer', v);
}

function float(e: Errors, v: unknown, loc: Loc): number | undefined {
  if (typeof v === 'number') return v;
  if (typeof v === 'boolean') return v ? 1 : 0;
  if (typeof v === 'string') {
    const t = v.trim();
    const n = t === '' ? NaN : Number(t);
    if (Number.isFinite(n)) return n;
    return e.add('float_parsing', loc, 'Input should be a valid number, unable to parse string as a number', v);
  }
  return e.add('float_type', loc, 'Input should be a valid number', v);
}

const TRUE_STRINGS = new Set(['1', 'on', 't', 'true', 'y', 'yes']);
const FALSE_STRINGS = new Set(['0', 'off', 'f', 'false', 'n', 'no']);

function bool(e: Errors, v: unknown, loc: Loc): boolean | undefined {
  if (typeof v === 'boolean') return v;
  if (typeof v === 'number') {
    if (v === 1) return true;
    if (v === 0) return false;
    return e.add('bool_parsing', loc, 'Input should be a valid boolean, unable to interpret input', v);
  }
  if (typeof v === 'string') {
    const t = v.trim().toLowerCase();
    if (TRUE_STRINGS.has(t)) return true;
    if (FALSE_STRINGS.has(t)) return false;
    return e.add('bool_parsing', loc, 'Input should be a valid boolean, unable to interpret input', v);
  }
  return e.add('bool_type', loc, 'Input should be a valid boolean', v);
}

function literal(e: Errors, v: unknown, loc: Loc, expected: string): string | undefined {
  if (v === expected) return expected;
  return e.add('literal_error', loc, `Input should be '${expected}'`, v, { expected: `'${expected}'` });
}

function url(e: Errors, v: unknown, loc: Loc): string | undefined {
  if (typeof v !== 'string') return e.add('url_type', loc, 'URL input should be a string or URL', v);
  let parsed: URL;
  try {
    parsed = new URL(v);
  } catch {
    const error = /^[A-Za-z][A-Za-z0-9+.-]*:/.test(v) ? 'empty host' : 'relative URL without a base';
    return e.add('url_parsing', loc, `Input should be a valid URL, ${error}`, v, { error });
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    return e.add('url_scheme', loc, "URL scheme should be 'http' or 'https'", v, { expected_schemes: "'http' or 'https'" });
  }
  return v;
}

// --- field access: required, or optional with a default ------------------------------------

/** A required field: `missing` (whose input is the containing object) when absent. */
function required<T>(e: Errors, obj: Obj, key: string, loc: Loc, check: (e: Errors, v: unknown, loc: Loc) => T | undefined): T | undefined {
  const v = get(obj, key);
  if (v === MISSING) return e.add('missing', [...loc, key], 'Field required', obj);
  return check(e, v, [...loc, key]);
}

/** An `Optional[...] = None` field: absent or null is null. `undefined` means it failed. */
function nullable<T>(
  e: Errors,
  obj: Obj,
  key: string,
  loc: Loc,
  check: (e: Errors, v: unknown, loc: Loc) => T | undefined,
): T | null | undefined {
  const v = get(obj, key);
  if (v === MISSING || v === null) return null;
  return check(e, v, [...loc, key]);
}

/** A pydantic discriminated union: the tag picks the model, whose errors carry the tag in their loc. */
function tagged<T>(
  e: Errors,
  v: unknown,
  loc: Loc,
  discriminator: string,
  variants: Record<string, (e: Errors, obj: Obj, loc: Loc) => T | undefined>,
): T | undefined {
  const obj = model(e, v, loc);
  if (!obj) return undefined;
  const tag = get(obj, discriminator);
  if (tag === MISSING) {
    return e.add('union_tag_not_found', loc, `Unable to extract tag using discriminator '${discriminator}'`, obj, {
      discriminator: `'${discriminator}'`,
    });
  }
  const variant = typeof tag === 'string' && Object.hasOwn(variants, tag) ? variants[tag] : undefined;
  if (!variant) {
    const expected = Object.keys(variants)
      .map((t) => `'${t}'`)
      .join(', ');
    const shown = typeof tag === 'string' ? tag : JSON.stringify(tag);
    return e.add(
      'union_tag_invalid',
      loc,
      `Input tag '${shown}' found using '${discriminator}' does not match any of the expected tags: ${expected}`,
      obj,
      { discriminator: `'${discriminator}'`, tag: shown, expected_tags: expected },
    );
  }
  return variant(e, obj, [...loc, tag as string]);
}

// --- the models -------------------------------------------------------------------------------

function configRequest(e: Errors, body: Obj, loc: Loc): ConfigRequest | undefined {
  const acme_server = nullable(e, body, 'acme_server', loc, url);
  const acme_eab_kid = nullable(e, body, 'acme_eab_kid', loc, str);
  const acme_eab_hmac_key = nullable(e, body, 'acme_eab_hmac_key', loc, str);
  if (acme_server === undefined || acme_eab_kid === undefined || acme_eab_hmac_key === undefined) return undefined;
  return { acme_server, acme_eab_kid, acme_eab_hmac_key };
}

const chatType = (e: Errors, v: unknown, loc: Loc): string | undefined => literal(e, v, loc, 'chat');

const chatModel = (e: Errors, v: unknown, loc: Loc): ChatModelRequest | undefined =>
  tagged<ChatModelRequest>(e, v, loc, 'format', {
    tgi: (e, obj, loc) => {
      const type = required(e, obj, 'type', loc, chatType);
      const name = required(e, obj, 'name', loc, str);
      const chat_template = required(e, obj, 'chat_template', loc, str);
      const eos_token = required(e, obj, 'eos_token', loc, str);
      if (type === undefined || name === undefined || chat_template === undefined || eos_token === undefined) return undefined;
      return { type: 'chat', name, format: 'tgi', chat_template, eos_token };
    },
    openai: (e, obj, loc) => {
      const type = required(e, obj, 'type', loc, chatType);
      const name = required(e, obj, 'name', loc, str);
      const prefix = required(e, obj, 'prefix', loc, str);
      if (type === undefined || name === undefined || prefix === undefined) return undefined;
      return { type: 'chat', name, format: 'openai', prefix };
    },
  });

function options(e: Errors, v: unknown, loc: Loc): RegisterServiceRequest['options'] | undefined {
  const obj = model(e, v, loc);
  if (!obj) return undefined;
  const openai = nullable(e, obj, 'openai', loc, (e, v, loc) => {
    const o = model(e, v, loc);
    if (!o) return undefined;
    const m = required(e, o, 'model', loc, chatModel);
    return m === undefined ? undefined : { model: m };
  });
  if (openai === undefined) return undefined;
  return openai === null ? {} : { openai };
}

const rateLimitKey = (e: Errors, v: unknown, loc: Loc): RateLimitRequest['key'] | undefined =>
  tagged<RateLimitRequest['key']>(e, v, loc, 'type', {
    ip_address: () => ({ type: 'ip_address' }),
    header: (e, obj, loc) => {
      const header = required(e, obj, 'header', loc, (e, v, loc) => patterned(e, v, loc, HEADER_RE, DSTACK_HEADER_PATTERN));
      return header === undefined ? undefined : { type: 'header', header };
    },
  });

function rateLimit(e: Errors, v: unknown, loc: Loc): RateLimitRequest | undefined {
  const obj = model(e, v, loc);
  if (!obj) return undefined;
  const prefix = required(e, obj, 'prefix', loc, (e, v, loc) => patterned(e, v, loc, PREFIX_RE, DSTACK_PREFIX_PATTERN));
  const key = required(e, obj, 'key', loc, rateLimitKey);
  const rps = required(e, obj, 'rps', loc, float);
  const burst = required(e, obj, 'burst', loc, int);
  if (prefix === undefined || key === undefined || rps === undefined || burst === undefined) return undefined;
  return { prefix, key, rps, burst };
}

function rateLimits(e: Errors, obj: Obj, loc: Loc): RateLimitRequest[] | undefined {
  const v = get(obj, 'rate_limits');
  if (v === MISSING) return [];
  const at = [...loc, 'rate_limits'];
  if (!Array.isArray(v)) return e.add('tuple_type', at, 'Input should be a valid tuple', v);
  const out: RateLimitRequest[] = [];
  let ok = true;
  for (let i = 0; i < v.length; i++) {
    const r = rateLimit(e, v[i], [...at, i]);
    if (r) out.push(r);
    else ok = false;
  }
  return ok ? out : undefined;
}

function registerServiceRequest(e: Errors, body: Obj, loc: Loc): RegisterServiceRequest | undefined {
  const id = nullable(e, body, 'id', loc, str);
  const run_name = required(e, body, 'run_name', loc, str);
  const domain = required(e, body, 'domain', loc, str);
  const https = required(e, body, 'https', loc, bool);
  const auth = required(e, body, 'auth', loc, bool);
  const client_max_body_size = required(e, body, 'client_max_body_size', loc, int);
  const opts = required(e, body, 'options', loc, options);
  const ssh_private_key = required(e, body, 'ssh_private_key', loc, str);
  const rate_limits = rateLimits(e, body, loc);
  const hasRouter = get(body, 'has_router_replica');
  const has_router_replica = hasRouter === MISSING ? false : bool(e, hasRouter, [...loc, 'has_router_replica']);
  const router = get(body, 'router');
  if (
    id === undefined ||
    run_name === undefined ||
    domain === undefined ||
    https === undefined ||
    auth === undefined ||
    client_max_body_size === undefined ||
    opts === undefined ||
    ssh_private_key === undefined ||
    rate_limits === undefined ||
    has_router_replica === undefined
  ) {
    return undefined;
  }
  return {
    id,
    run_name: run_name.toLowerCase(),
    domain: domain.toLowerCase(),
    https,
    auth,
    client_max_body_size,
    options: opts,
    ssh_private_key,
    rate_limits,
    has_router_replica,
    // Checked by the mapper: any router at all is refused with a sentence, not a 422.
    router: router === MISSING ? null : router,
  };
}

function sshHop(e: Errors, v: unknown, loc: Loc): SshHopRequest | undefined {
  const obj = model(e, v, loc);
  if (!obj) return undefined;
  const asText = (e: Errors, v: unknown, loc: Loc): string | undefined => str(e, v, loc, true);
  const hostname = required(e, obj, 'hostname', loc, asText);
  const username = required(e, obj, 'username', loc, asText);
  const port = required(e, obj, 'port', loc, int);
  if (hostname === undefined || username === undefined || port === undefined) return undefined;
  return { hostname, username, port };
}

function registerReplicaRequest(e: Errors, body: Obj, loc: Loc): RegisterReplicaRequest | undefined {
  const job_id = required(e, body, 'job_id', loc, str);
  const app_port = required(e, body, 'app_port', loc, int);
  const ssh_host = required(e, body, 'ssh_host', loc, str);
  const ssh_port = required(e, body, 'ssh_port', loc, int);
  const ssh_proxy = nullable(e, body, 'ssh_proxy', loc, sshHop);
  const ssh_proxy_private_key = nullable(e, body, 'ssh_proxy_private_key', loc, str);
  const ssh_head_proxy = nullable(e, body, 'ssh_head_proxy', loc, sshHop);
  const ssh_head_proxy_private_key = nullable(e, body, 'ssh_head_proxy_private_key', loc, str);
  const internal_ip = nullable(e, body, 'internal_ip', loc, str);
  if (
    job_id === undefined ||
    app_port === undefined ||
    ssh_host === undefined ||
    ssh_port === undefined ||
    ssh_proxy === undefined ||
    ssh_proxy_private_key === undefined ||
    ssh_head_proxy === undefined ||
    ssh_head_proxy_private_key === undefined ||
    internal_ip === undefined
  ) {
    return undefined;
  }
  return {
    job_id,
    app_port,
    ssh_host,
    ssh_port,
    ssh_proxy,
    ssh_proxy_private_key,
    ssh_head_proxy,
    ssh_head_proxy_private_key,
    internal_ip,
  };
}

function registerEntrypointRequest(e: Errors, body: Obj, loc: Loc): RegisterEntrypointRequest | undefined {
  const domain = required(e, body, 'domain', loc, str);
  const https = required(e, body, 'https', loc, bool);
  if (domain === undefined || https === undefined) return undefined;
  return { domain: domain.toLowerCase(), https };
}

// --- the entry point ----------------------------------------------------------------------------

/** Which calls carry a JSON body (the others are bodiless POSTs). */
const HAS_BODY: Record<CallKind, boolean> = {
  config: true,
  registerService: true,
  unregisterService: false,
  setServiceId: true,
  registerReplica: true,
  unregisterReplica: false,
  registerEntrypoint: true,
};

/**
 * Check one call's path parameters and JSON body (already parsed; undefined when the request
 * had none) as dstack's gateway would, and hand back the call for the mapper.
 */
export function parseCall(route: CallKind, params: PathParams, body: unknown): ParseResult {
  const e = new Errors();
  const path = (value: string | undefined, name: string): string | undefined => {
    // FastAPI's path parameters are plain `str`: only absence can fail (a route bug, really).
    if (value === undefined) return e.add('missing', ['path', name], 'Field required', null);
    return value;
  };
  const needsProject = route !== 'config';
  const needsRun = route !== 'config' && route !== 'registerService' && route !== 'registerEntrypoint';
  const project = needsProject ? path(params.project, 'project_name')?.toLowerCase() : '';
  const run = needsRun ? path(params.run, 'run_name')?.toLowerCase() : '';
  const jobId = route === 'unregisterReplica' ? path(params.jobId, 'job_id') : '';

  let obj: Obj | undefined;
  if (HAS_BODY[route]) {
    if (body === undefined || body === null) e.add('missing', ['body'], 'Field required', null);
    else obj = model(e, body, ['body']);
  }
  const loc: Loc = ['body'];
  // The body is checked even when a path parameter failed: FastAPI lists every error, path first.
  const call = buildCall(e, route, obj, loc);
  const pathOk = project !== undefined && run !== undefined && jobId !== undefined;
  if (pathOk && call && e.items.length === 0) return { ok: true, call: withPath(call, project, run, jobId) };
  return { ok: false, detail: e.items };
}

/** The call with its body checked; path fields are filled in by withPath. */
function buildCall(e: Errors, route: CallKind, obj: Obj | undefined, loc: Loc): Call | undefined {
  switch (route) {
    case 'unregisterService':
      return { kind: 'unregisterService', project: '', run: '' };
    case 'unregisterReplica':
      return { kind: 'unregisterReplica', project: '', run: '', jobId: '' };
  }
  if (!obj) return undefined;
  switch (route) {
    case 'config': {
      const b = configRequest(e, obj, loc);
      return b && { kind: 'config', body: b };
    }
    case 'registerService': {
      const b = registerServiceRequest(e, obj, loc);
      return b && { kind: 'registerService', project: '', body: b };
    }
    case 'setServiceId': {
      const id = required(e, obj, 'id', loc, str);
      return id === undefined ? undefined : { kind: 'setServiceId', project: '', run: '', id };
    }
    case 'registerReplica': {
      const b = registerReplicaRequest(e, obj, loc);
      return b && { kind: 'registerReplica', project: '', run: '', body: b };
    }
    case 'registerEntrypoint': {
      const b = registerEntrypointRequest(e, obj, loc);
      return b && { kind: 'registerEntrypoint', project: '', body: b };
    }
  }
}

function withPath(call: Call, project: string, run: string, jobId: string): Call {
  switch (call.kind) {
    case 'config':
      return call;
    case 'registerService':
    case 'registerEntrypoint':
      return { ...call, project };
    case 'unregisterReplica':
      return { ...call, project, run, jobId };
    default:
      return { ...call, project, run };
  }
}

/** FastAPI's answer to a body that is not JSON at all: one `json_invalid` error at the failing offset. */
export function jsonInvalidDetail(position: number, error = 'Expecting value'): ValidationErrorItem[] {
  return [{ type: 'json_invalid', loc: ['body', position], msg: 'JSON decode error', input: {}, ctx: { error } }];
}
