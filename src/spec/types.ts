// The desired-state document. These types mirror src/spec/schema.ts;
// test/spec/types.test.ts checks that the two agree field for field.

export const API_VERSION = 'proxy.dstack.ai/v1alpha1';
export const KIND = 'ProxyState';

export const LETS_ENCRYPT_PRODUCTION = 'https://acme-v02.api.letsencrypt.org/directory';
export const DEFAULT_CLIENT_MAX_BODY_SIZE = 64 * 1024 * 1024; // 64 MiB
export const DEFAULT_SSH_PORT = 22;
export const DEFAULT_MODEL_PREFIX = '/v1';

/** A document larger than this is rejected before parsing. */
export const MAX_DOCUMENT_BYTES = 16 * 1024 * 1024; // 16 MiB
export const MAX_SERVICES = 20_000;

export interface Acme {
  server: string;
  eabKid?: string;
  /** Secret. */
  eabHmacKey?: string;
  email?: string;
}

export interface Project {
  name: string;
  /** Secret. Needed only by projects with SSH replicas. */
  sshPrivateKey?: string;
}

export interface SshHop {
  host: string;
  port: number;
  user: string;
  /** `SHA256:<base64>` as `ssh-keygen -lf` prints it; without one, trust on first use. */
  hostKeyFingerprint?: string;
}

export interface SshProxyHop extends SshHop {
  /** Secret. Defaults to the project's key. */
  privateKey?: string;
}

export interface DirectTarget {
  host: string;
  port: number;
}

/**
 * How a replica's SSH host keys are trusted when the document pins no fingerprint.
 * `tofu`: the first key a hop (named by the path that reaches it) presents is trusted for the
 * life of the process. `tofu-per-replica`: the same, but scoped to this replica id, so a new
 * replica behind a reused host and port may present a new key (dstack's runner generates fresh
 * host keys for every job container) while a key that changes under a running replica is
 * still refused.
 */
export type HostKeyPolicy = 'tofu' | 'tofu-per-replica';

export interface Replica {
  id: string;
  appPort: number;
  /** Absent: `tofu`. */
  hostKeyPolicy?: HostKeyPolicy;
  ssh?: SshHop;
  sshProxy?: SshProxyHop;
  sshHeadProxy?: SshProxyHop;
  direct?: DirectTarget;
}

export type RateLimitKey = { type: 'ipAddress' } | { type: 'header'; header: string };

export interface RateLimit {
  prefix: string;
  key: RateLimitKey;
  rps: number;
  burst: number;
}

export interface OpenAIModel {
  name: string;
  format: 'openai';
  prefix: string;
}

export interface TGIModel {
  name: string;
  format: 'tgi';
  chatTemplate?: string;
  eosToken?: string;
  bosToken?: string;
}

export type Model = OpenAIModel | TGIModel;

/** The paths a service with a router replica serves; every other path gets 403. */
export const ROUTER_ALLOWED_PATHS: readonly { exact?: string; prefix?: string }[] = [
  { exact: '/generate' },
  { prefix: '/v1/' },
  { exact: '/chat/completions' },
];

export interface Service {
  project: string;
  run: string;
  id?: string;
  /**
   * Who manages the service: a writer that owns a slice of the document (the dstack
   * compatibility routes write `dstack-server`) lists and removes only its own services.
   */
  owner?: string;
  domain?: string;
  /** Only ROUTER_ALLOWED_PATHS pass; absent means every path. */
  routerAllowlist?: boolean;
  /** Seconds to wait between two reads from a replica; absent: the daemon's default. */
  readTimeout?: number;
  https: boolean;
  auth: boolean;
  clientMaxBodySize: number;
  stripPrefix: boolean;
  rateLimits: RateLimit[];
  model?: Model;
  replicas: Replica[];
}

export interface Entrypoint {
  project: string;
  domain: string;
  https: boolean;
}

export interface ProxyStateSpec {
  acme: Acme;
  projects: Project[];
  services: Service[];
  entrypoints: Entrypoint[];
}

export interface Metadata {
  generation?: number;
  hash?: string;
}

/** A normalised document: every default filled in, every list sorted. */
export interface ProxyState {
  apiVersion: typeof API_VERSION;
  kind: typeof KIND;
  metadata?: Metadata;
  spec: ProxyStateSpec;
}

/** The key that names a service everywhere: `<project>/<run>`. */
export function serviceKey(s: { project: string; run: string }): string {
  return `${s.project}/${s.run}`;
}

/** An empty document: the state before the first PUT. */
export function emptyState(): ProxyState {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: { acme: { server: LETS_ENCRYPT_PRODUCTION }, projects: [], services: [], entrypoints: [] },
  };
}
