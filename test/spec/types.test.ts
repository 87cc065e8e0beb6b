// src/spec/types.ts and the JSON Schema agree: a maximal ProxyState (every optional field set,
// which the compiler checks through Required<…>) validates, and the schema defines exactly
// the properties that document has.

import { TEST_KEY_A, TEST_KEY_C, TEST_KEY_D } from '../helpers/keys.js';
import { describe, expect, it } from 'vitest';
import { proxyStateSchema } from '../../src/spec/schema.js';
import type {
  Acme,
  DirectTarget,
  Entrypoint,
  Metadata,
  OpenAIModel,
  Project,
  ProxyState,
  ProxyStateSpec,
  RateLimit,
  Replica,
  Service,
  SshHop,
  SshProxyHop,
  TGIModel,
} from '../../src/spec/index.js';
import { expectValid } from './expect.js';

const fingerprint = `SHA256:${'B'.repeat(43)}`;
const hop: Required<SshHop> = { host: '203.0.113.7', port: 22, user: 'ubuntu', hostKeyFingerprint: fingerprint };
const proxyHop: Required<SshProxyHop> = {
  host: '198.51.100.2',
  port: 2222,
  user: 'root',
  hostKeyFingerprint: fingerprint,
  privateKey: TEST_KEY_C,
};
const headHop: Required<SshProxyHop> = {
  host: '192.0.2.9',
  port: 2200,
  user: 'debian',
  hostKeyFingerprint: fingerprint,
  privateKey: TEST_KEY_D,
};
const direct: Required<DirectTarget> = { host: '10.0.0.5', port: 8000 };
const sshReplica: Required<Omit<Replica, 'direct'>> = {
  id: 'r1',
  appPort: 8000,
  hostKeyPolicy: 'tofu-per-replica',
  ssh: hop,
  sshProxy: proxyHop,
  sshHeadProxy: headHop,
};
const directReplica: Required<Pick<Replica, 'id' | 'appPort' | 'direct'>> = { id: 'r2', appPort: 8000, direct };
const ipLimit: Required<RateLimit> = { prefix: '/', key: { type: 'ipAddress' }, rps: 10, burst: 20 };
const headerLimit: Required<RateLimit> = { prefix: '/v1', key: { type: 'header', header: 'x-api-key' }, rps: 2.5, burst: 0 };
const openai: Required<OpenAIModel> = { name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/v1' };
const tgi: Required<TGIModel> = {
  name: 'mistralai/Mistral-7B',
  format: 'tgi',
  chatTemplate: '{{ messages }}',
  eosToken: '</s>',
  bosToken: '<s>',
};
const service = (run: string, model: NonNullable<Service['model']>, replicas: Replica[]): Required<Service> => ({
  project: 'main',
  run,
  id: `${run}-id`,
  owner: 'dstack-server',
  domain: `${run}.gw.example.com`,
  routerAllowlist: true,
  readTimeout: 900,
  https: true,
  auth: true,
  clientMaxBodySize: 1024,
  stripPrefix: false,
  rateLimits: [ipLimit, headerLimit],
  model,
  replicas,
});
const acme: Required<Acme> = { server: 'https://acme.example.com/dir', eabKid: 'kid-1', eabHmacKey: 'c2VjcmV0', email: 'ops@example.com' };
const project: Required<Project> = { name: 'main', sshPrivateKey: TEST_KEY_A };
const entrypoint: Required<Entrypoint> = { project: 'main', domain: 'gateway.gw.example.com', https: false };
const metadata: Required<Metadata> = { generation: 3, hash: 'c'.repeat(64) };
const spec: Required<ProxyStateSpec> = {
  acme,
  projects: [project],
  services: [service('llama', openai, [sshReplica, directReplica]), service('mistral', tgi, [{ ...directReplica, id: 'r3' }])],
  entrypoints: [entrypoint],
};
/** Every optional field of every type set at least once. */
const maximal: Required<ProxyState> = { apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', metadata, spec };

/** Property paths the schema defines, array items as `[]`; `key.header` etc. included. */
function schemaPaths(schema: unknown, at = ''): string[] {
  const s = schema as { properties?: Record<string, unknown>; items?: unknown };
  const out: string[] = [];
  for (const [name, sub] of Object.entries(s.properties ?? {})) {
    const path = at ? `${at}.${name}` : name;
    out.push(path, ...schemaPaths(sub, path));
  }
  if (s.items) out.push(...schemaPaths(s.items, `${at}[]`));
  return out;
}

function documentPaths(v: unknown, at = ''): string[] {
  if (Array.isArray(v)) return v.flatMap((x) => documentPaths(x, `${at}[]`));
  if (v === null || typeof v !== 'object') return [];
  return Object.entries(v).flatMap(([k, x]) => {
    const path = at ? `${at}.${k}` : k;
    return [path, ...documentPaths(x, path)];
  });
}

describe('types.ts and schema.ts', () => {
  it('the maximal typed document validates against the schema', () => {
    const state = expectValid(maximal);
    // and survives normalisation field for field (it is already normalised)
    expect(state.spec).toEqual(maximal.spec);
  });

  it('every property the schema defines is set in the maximal document', () => {
    const inDoc = new Set(documentPaths(maximal));
    expect(schemaPaths(proxyStateSchema).filter((p) => !inDoc.has(p))).toEqual([]);
  });

  it('every property of the maximal document is defined by the schema', () => {
    const inSchema = new Set(schemaPaths(proxyStateSchema));
    expect([...new Set(documentPaths(maximal))].filter((p) => !inSchema.has(p))).toEqual([]);
  });

  it('the schema walk sees the deep properties (sanity check of the walk)', () => {
    expect(schemaPaths(proxyStateSchema)).toEqual(
      expect.arrayContaining([
        'spec.services[].replicas[].sshHeadProxy.privateKey',
        'spec.services[].rateLimits[].key.header',
        'metadata.hash',
      ]),
    );
  });
});
