// The document as a user may write it (schema-valid, defaults omitted). normalise() turns
// it into a ProxyState.

import type { Acme, DirectTarget, HostKeyPolicy, Model, Project, RateLimitKey, SshHop, SshProxyHop } from './types.js';

export interface RateLimitInput {
  prefix: string;
  key: { type: RateLimitKey['type']; header?: string };
  rps: number;
  burst?: number;
}

export interface ModelInput {
  name: string;
  format: Model['format'];
  prefix?: string;
  chatTemplate?: string;
  eosToken?: string;
  bosToken?: string;
}

export interface ReplicaInput {
  id: string;
  appPort: number;
  hostKeyPolicy?: HostKeyPolicy;
  ssh?: Omit<SshHop, 'port'> & { port?: number };
  sshProxy?: Omit<SshProxyHop, 'port'> & { port?: number };
  sshHeadProxy?: Omit<SshProxyHop, 'port'> & { port?: number };
  direct?: DirectTarget;
}

export interface ServiceInput {
  project: string;
  run: string;
  id?: string;
  owner?: string;
  domain?: string;
  routerAllowlist?: boolean;
  readTimeout?: number;
  https?: boolean;
  auth?: boolean;
  clientMaxBodySize?: number;
  stripPrefix?: boolean;
  rateLimits?: RateLimitInput[];
  model?: ModelInput;
  replicas?: ReplicaInput[];
}

export interface EntrypointInput {
  project: string;
  domain: string;
  https?: boolean;
}

export interface ProxyStateInput {
  apiVersion: string;
  kind: string;
  metadata?: { generation?: number; hash?: string };
  spec: {
    acme?: Partial<Acme>;
    projects?: Project[];
    services?: ServiceInput[];
    entrypoints?: EntrypointInput[];
  };
}
