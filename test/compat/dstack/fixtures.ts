// Request bodies exactly as an unmodified dstack server's gateway client serialises them
// (`server/services/gateways/client.py`): snake_case, the same keys in the same order, `null`
// where the server sends null, and a key left out where the server leaves it out (a direct VM
// replica has no `ssh_proxy_private_key`; no service payload has `router`). Every builder
// takes overrides so the e2e tests and benchmarks can point the payloads at a loopback sshd.
//
// Each payload also carries a field or two a newer server might add (`extra`), because
// pydantic ignores unknown fields and so must we; pass `extra: {}` for the bare payload.

import { createPublicKey, generateKeyPairSync, randomUUID } from 'node:crypto';

/** A run or job id as the server sends it: `uuid4().hex`, 32 lower-case hex digits. */
export function dstackId(): string {
  return randomUUID().replaceAll('-', '');
}

/** `settings.DEFAULT_SERVICE_CLIENT_MAX_BODY_SIZE`: what the server sends for every service. */
export const DSTACK_CLIENT_MAX_BODY_SIZE = 64 * 1024 * 1024;
/** `DSTACK_RUNNER_SSH_PORT`: the runner's sshd inside a job container. */
export const DSTACK_RUNNER_SSH_PORT = 10022;
/** Pebble's directory on loopback, as test/helpers/pebble.ts starts it by default. */
export const PEBBLE_DIRECTORY = 'https://127.0.0.1:14000/dir';

export interface DstackKey {
  /** RSA-2048, PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as the server generates project keys. */
  privateKey: string;
  /** The OpenSSH public key line (`ssh-rsa AAAA… comment\n`), for an sshd's authorized_keys. */
  publicKey: string;
}

/** A project key as dstack's server makes one: RSA-2048 in PKCS#8 PEM, plus its authorized_keys line. */
export function dstackProjectKey(comment = 'dstack-project'): DstackKey {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', {
    modulusLength: 2048,
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    publicKeyEncoding: { type: 'spki', format: 'der' },
  });
  return { privateKey, publicKey: `${sshRsaPublicKey(publicKey)} ${comment}\n` };
}

/** `ssh-rsa <base64>` from an RSA public key in SPKI DER: the wire form is string "ssh-rsa", mpint e, mpint n. */
function sshRsaPublicKey(spkiDer: Buffer): string {
  // Node's JWK export gives e and n as unsigned big-endian base64url: no ASN.1 walking needed.
  const jwk = createPublicKey({ key: spkiDer, format: 'der', type: 'spki' }).export({ format: 'jwk' });
  const mpint = (b64url: string | undefined): Buffer => {
    let bytes = Buffer.from(b64url ?? '', 'base64url');
    // An mpint with its high bit set would read as negative: prefix a zero byte.
    if (bytes.length > 0 && (bytes[0] ?? 0) & 0x80) bytes = Buffer.concat([Buffer.from([0]), bytes]);
    return bytes;
  };
  const field = (b: Buffer): Buffer => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    return Buffer.concat([len, b]);
  };
  const blob = Buffer.concat([field(Buffer.from('ssh-rsa')), field(mpint(jwk.e)), field(mpint(jwk.n))]);
  return `ssh-rsa ${blob.toString('base64')}`;
}

// ---------------------------------------------------------------------------------------------
// POST /api/config

export interface ConfigPayload {
  acme_server: string | null;
  acme_eab_kid: string | null;
  acme_eab_hmac_key: string | null;
  [extra: string]: unknown;
}

/** `submit_gateway_config`: the server's DSTACK_ACME_* settings, each null when unset (the default). */
export function configPayload(over: Partial<ConfigPayload> = {}): ConfigPayload {
  return { acme_server: null, acme_eab_kid: null, acme_eab_hmac_key: null, ...over };
}

/** The same pointed at a Pebble directory (or any ACME URL), with optional EAB credentials. */
export function pebbleConfigPayload(url = PEBBLE_DIRECTORY, eab?: { kid: string; hmacKey: string }): ConfigPayload {
  return configPayload({ acme_server: url, acme_eab_kid: eab?.kid ?? null, acme_eab_hmac_key: eab?.hmacKey ?? null });
}

// ---------------------------------------------------------------------------------------------
// POST /api/registry/{project}/services/register

export interface OpenAIModelPayload {
  type: 'chat';
  name: string;
  format: 'openai';
  prefix: string;
}

export interface TGIModelPayload {
  type: 'chat';
  name: string;
  format: 'tgi';
  chat_template: string | null;
  eos_token: string | null;
}

/** `conf.model.model_dump()` of an OpenAIChatModel. */
export function openaiModel(over: Partial<OpenAIModelPayload> = {}): OpenAIModelPayload {
  return { type: 'chat', name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/v1', ...over };
}

/** A TGIChatModel after the server filled chat_template and eos_token from the HF tokenizer config. */
export function tgiModel(over: Partial<TGIModelPayload> = {}): TGIModelPayload {
  return {
    type: 'chat',
    name: 'mistralai/Mistral-7B-Instruct-v0.2',
    format: 'tgi',
    chat_template:
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
    eos_token: '</s>',
    ...over,
  };
}

export interface RateLimitPayload {
  prefix: string;
  key: { type: 'ip_address' } | { type: 'header'; header: string };
  rps: number;
  burst: number;
}

/** `RateLimit.model_dump()` partitioned by client address. */
export function ipRateLimit(over: Partial<Omit<RateLimitPayload, 'key'>> = {}): RateLimitPayload {
  return { prefix: '/', key: { type: 'ip_address' }, rps: 2.5, burst: 5, ...over };
}

/** `RateLimit.model_dump()` partitioned by a request header (sent as the user wrote it). */
export function headerRateLimit(header = 'X-API-Key', over: Partial<Omit<RateLimitPayload, 'key'>> = {}): RateLimitPayload {
  return { prefix: '/v1/chat/completions', key: { type: 'header', header }, rps: 10, burst: 0, ...over };
}

export interface RegisterServicePayload {
  id: string | null;
  run_name: string;
  domain: string;
  https: boolean;
  auth: boolean;
  client_max_body_size: number;
  options: { openai?: { model: OpenAIModelPayload | TGIModelPayload } };
  rate_limits: RateLimitPayload[];
  ssh_private_key: string;
  has_router_replica: boolean;
  [extra: string]: unknown;
}

/** Fields a newer server might add to a service registration; the gateway must ignore them. */
export const FUTURE_SERVICE_FIELDS = { read_timeout: 600, labels: { team: 'ml' } } as const;

export interface RegisterServiceOptions {
  id?: string | null;
  runName?: string;
  /** Default: `<runName>.<project>.example.test`, as the server builds `<run>.<gateway wildcard>`. */
  domain?: string;
  project?: string;
  https?: boolean;
  auth?: boolean;
  clientMaxBodySize?: number;
  /** null: a service without a model (`options: {}`). */
  model?: OpenAIModelPayload | TGIModelPayload | null;
  rateLimits?: RateLimitPayload[];
  sshPrivateKey: string;
  hasRouterReplica?: boolean;
  extra?: Record<string, unknown>;
}

/** `register_service`'s payload; the default has an openai model, no rate limits, auth on, https off. */
export function registerServicePayload(o: RegisterServiceOptions): RegisterServicePayload {
  const runName = o.runName ?? 'llama-svc';
  const model = o.model === undefined ? openaiModel() : o.model;
  return {
    id: o.id === undefined ? dstackId() : o.id,
    run_name: runName,
    domain: o.domain ?? `${runName}.${o.project ?? 'main'}.example.test`,
    https: o.https ?? false,
    auth: o.auth ?? true,
    client_max_body_size: o.clientMaxBodySize ?? DSTACK_CLIENT_MAX_BODY_SIZE,
    options: model === null ? {} : { openai: { model } },
    rate_limits: o.rateLimits ?? [],
    ssh_private_key: o.sshPrivateKey,
    has_router_replica: o.hasRouterReplica ?? false,
    ...(o.extra ?? FUTURE_SERVICE_FIELDS),
  };
}

/** The entrypoint the client registers before every service with a model: `gateway.<domain minus its first label>`. */
export function openaiEntrypointDomain(serviceDomain: string): string {
  return `gateway.${serviceDomain.split('.').slice(1).join('.')}`;
}

// ---------------------------------------------------------------------------------------------
// POST /api/registry/{project}/services/{run}/replicas/register

export interface SshHopPayload {
  hostname: string;
  username: string;
  port: number;
}

export interface RegisterReplicaPayload {
  job_id: string;
  app_port: number;
  ssh_head_proxy: SshHopPayload | null;
  ssh_head_proxy_private_key: string | null;
  internal_ip: string | null;
  ssh_port: number;
  ssh_host: string;
  ssh_proxy: SshHopPayload | null;
  /** Absent for a replica on a VM, present (null or a key) for a dockerized one. */
  ssh_proxy_private_key?: string | null;
  [extra: string]: unknown;
}

/** Fields a newer server might add to a replica registration; the gateway must ignore them. */
export const FUTURE_REPLICA_FIELDS = { replica_group: 'default', worker_role: null } as const;

interface ReplicaCommon {
  jobId?: string;
  appPort?: number;
  internalIp?: string | null;
  /** An SSH fleet's head node (bastion) and its key: the outermost hop. */
  headProxy?: SshHopPayload;
  headProxyKey?: string;
  extra?: Record<string, unknown>;
}

/** A job on a VM, not dockerized: `ssh_host = "<user>@<host>"`, the VM's sshd port, the VM's own proxy (usually none). */
export function vmReplicaPayload(
  o: ReplicaCommon & { user?: string; host?: string; sshPort?: number; sshProxy?: SshHopPayload | null } = {},
): RegisterReplicaPayload {
  return {
    job_id: o.jobId ?? dstackId(),
    app_port: o.appPort ?? 8000,
    ssh_head_proxy: o.headProxy ?? null,
    ssh_head_proxy_private_key: o.headProxyKey ?? null,
    internal_ip: o.internalIp === undefined ? '10.0.0.5' : o.internalIp,
    ssh_port: o.sshPort ?? 22,
    ssh_host: `${o.user ?? 'ubuntu'}@${o.host ?? '127.0.0.1'}`,
    ssh_proxy: o.sshProxy ?? null,
    ...(o.extra ?? FUTURE_REPLICA_FIELDS),
  };
}

/**
 * A dockerized job (the common cloud case): `root@localhost` on the container's mapped runner
 * port, reached through the VM's sshd as `ssh_proxy`; `ssh_proxy_private_key` is null (the
 * project's key) unless the fleet is imported from another project.
 */
export function dockerReplicaPayload(
  o: ReplicaCommon & {
    containerUser?: string;
    containerHost?: string;
    containerSshPort?: number;
    vm?: Partial<SshHopPayload>;
    vmKey?: string | null;
  } = {},
): RegisterReplicaPayload {
  return {
    job_id: o.jobId ?? dstackId(),
    app_port: o.appPort ?? 8000,
    ssh_head_proxy: o.headProxy ?? null,
    ssh_head_proxy_private_key: o.headProxyKey ?? null,
    internal_ip: o.internalIp === undefined ? '10.0.0.6' : o.internalIp,
    ssh_port: o.containerSshPort ?? DSTACK_RUNNER_SSH_PORT,
    ssh_host: `${o.containerUser ?? 'root'}@${o.containerHost ?? 'localhost'}`,
    ssh_proxy: { hostname: o.vm?.hostname ?? '127.0.0.1', username: o.vm?.username ?? 'ubuntu', port: o.vm?.port ?? 22 },
    ssh_proxy_private_key: o.vmKey ?? null,
    ...(o.extra ?? FUTURE_REPLICA_FIELDS),
  };
}

/** A job on an SSH fleet behind a head node: the VM payload plus `ssh_head_proxy` and its key. */
export function headProxyReplicaPayload(
  o: ReplicaCommon & { user?: string; host?: string; sshPort?: number; head?: Partial<SshHopPayload>; headKey: string },
): RegisterReplicaPayload {
  return vmReplicaPayload({
    ...o,
    host: o.host ?? '10.0.1.7',
    headProxy: { hostname: o.head?.hostname ?? '127.0.0.1', username: o.head?.username ?? 'ubuntu', port: o.head?.port ?? 22 },
    headProxyKey: o.headKey,
  });
}

// ---------------------------------------------------------------------------------------------
// POST /api/registry/{project}/entrypoints/register, …/services/{run}/set_id

export interface RegisterEntrypointPayload {
  domain: string;
  https: boolean;
  [extra: string]: unknown;
}

export function entrypointPayload(over: Partial<RegisterEntrypointPayload> = {}): RegisterEntrypointPayload {
  return { domain: 'gateway.main.example.test', https: false, ...over };
}

export function setIdPayload(id: string = dstackId()): { id: string } {
  return { id };
}

// ---------------------------------------------------------------------------------------------
// The paths the client posts to (project and run as the server names them; the gateway lower-cases).

export const dstackPaths = {
  config: '/api/config',
  list: '/api/services/list',
  stats: '/api/stats/collect',
  registerService: (project: string) => `/api/registry/${project}/services/register`,
  unregisterService: (project: string, run: string) => `/api/registry/${project}/services/${run}/unregister`,
  setServiceId: (project: string, run: string) => `/api/registry/${project}/services/${run}/set_id`,
  registerReplica: (project: string, run: string) => `/api/registry/${project}/services/${run}/replicas/register`,
  unregisterReplica: (project: string, run: string, jobId: string) =>
    `/api/registry/${project}/services/${run}/replicas/${jobId}/unregister`,
  registerEntrypoint: (project: string) => `/api/registry/${project}/entrypoints/register`,
} as const;
