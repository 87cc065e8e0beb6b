// The calls an unmodified dstack server makes to its gateway, as our routes hand them to the
// mapper: the payload already checked against dstack's request models (unknown fields dropped,
// names lower-cased where dstack's router lower-cases them). Field names stay dstack's so a
// reader can hold them against the server's client side by side.

/** The owner the compatibility routes write on their services: they list and remove only these. */
export const DSTACK_OWNER = 'dstack-server';

export interface ConfigRequest {
  acme_server: string | null;
  acme_eab_kid: string | null;
  acme_eab_hmac_key: string | null;
}

export interface RateLimitRequest {
  prefix: string;
  key: { type: 'ip_address' } | { type: 'header'; header: string };
  rps: number;
  burst: number;
}

export type ChatModelRequest =
  | { type: 'chat'; name: string; format: 'openai'; prefix: string }
  | { type: 'chat'; name: string; format: 'tgi'; chat_template: string; eos_token: string };

export interface RegisterServiceRequest {
  id: string | null;
  run_name: string;
  domain: string;
  https: boolean;
  auth: boolean;
  client_max_body_size: number;
  options: { openai?: { model: ChatModelRequest } };
  ssh_private_key: string;
  rate_limits: RateLimitRequest[];
  has_router_replica: boolean;
  /** Gateway-side routers are gone from dstack; only null is accepted. */
  router: unknown;
}

export interface SshHopRequest {
  hostname: string;
  username: string;
  port: number;
}

export interface RegisterReplicaRequest {
  job_id: string;
  app_port: number;
  /** `user@host`, split at the last '@'. */
  ssh_host: string;
  ssh_port: number;
  ssh_proxy: SshHopRequest | null;
  ssh_proxy_private_key: string | null;
  ssh_head_proxy: SshHopRequest | null;
  ssh_head_proxy_private_key: string | null;
  internal_ip: string | null;
}

export interface RegisterEntrypointRequest {
  domain: string;
  https: boolean;
}

/** One call, as the mapper sees it. `project` and `run` are lower-cased, as dstack's router does. */
export type Call =
  | { kind: 'config'; body: ConfigRequest }
  | { kind: 'registerService'; project: string; body: RegisterServiceRequest }
  | { kind: 'unregisterService'; project: string; run: string }
  | { kind: 'setServiceId'; project: string; run: string; id: string }
  | { kind: 'registerReplica'; project: string; run: string; body: RegisterReplicaRequest }
  | { kind: 'unregisterReplica'; project: string; run: string; jobId: string }
  | { kind: 'registerEntrypoint'; project: string; body: RegisterEntrypointRequest };

/** The answer of `GET /api/services/list`. */
export interface ListServicesResponse {
  services: { id: string | null; project_name: string; run_name: string; replicas: { id: string }[] }[];
}
