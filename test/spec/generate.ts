// Random valid documents for the property tests, from a seeded PRNG.

import type { ProxyStateInput, ReplicaInput, ServiceInput } from '../../src/spec/input.js';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { TEST_KEY_A, TEST_KEY_B, TEST_KEY_C, TEST_KEY_D } from '../helpers/keys.js';
import { chance, int, pick, type Rng } from './fixtures.js';

const FINGERPRINT = `SHA256:${'A'.repeat(42)}Q`;

export function randomDocument(rng: Rng): ProxyStateInput {
  const projects = Array.from({ length: int(rng, 1, 4) }, (_, i) => ({
    name: `proj-${i}-${int(rng, 0, 99)}`,
    ...(chance(rng, 0.7) ? { sshPrivateKey: pick(rng, [TEST_KEY_A, TEST_KEY_B, TEST_KEY_C, TEST_KEY_D]) } : {}),
  }));
  const doc: ProxyStateInput = { apiVersion: API_VERSION, kind: KIND, spec: {} };
  if (chance(rng)) {
    doc.spec.acme = {
      ...(chance(rng) ? { server: pick(rng, ['https://acme.example.com/dir', 'https://acme-v02.api.letsencrypt.org/directory']) } : {}),
      ...(chance(rng) ? { email: 'ops@example.com' } : {}),
      ...(chance(rng) ? { eabKid: `kid-${int(rng, 0, 999)}`, eabHmacKey: `hmac${int(rng, 0, 1e6)}` } : {}),
    };
  }
  doc.spec.projects = projects;
  let replicaSeq = 0;
  const services: ServiceInput[] = [];
  for (let i = 0, n = int(rng, 0, 6); i < n; i++) {
    const project = pick(rng, projects);
    const s: ServiceInput = { project: project.name, run: `run-${i}` };
    if (chance(rng)) s.id = `id${int(rng, 0, 1e9)}`;
    if (chance(rng, 0.7)) s.domain = `svc-${i}.gw.example.com`;
    if (chance(rng)) s.https = chance(rng);
    if (chance(rng)) s.auth = chance(rng);
    if (chance(rng)) s.stripPrefix = chance(rng);
    if (chance(rng)) s.clientMaxBodySize = pick(rng, [0, 1024, 64 * 1024 * 1024, 1e9]);
    if (chance(rng)) {
      s.rateLimits = Array.from({ length: int(rng, 0, 3) }, (_, j) => ({
        prefix: `/p${j}`,
        key: chance(rng) ? { type: 'ipAddress' as const } : { type: 'header' as const, header: `X-Key-${j}` },
        rps: int(rng, 1, 40) / 2,
        ...(chance(rng) ? { burst: int(rng, 0, 50) } : {}),
      }));
    }
    if (chance(rng, 0.6)) {
      s.model = chance(rng)
        ? { name: `org/model-${i}`, format: 'openai', ...(chance(rng) ? { prefix: pick(rng, ['/v1', '/openai/v1']) } : {}) }
        : {
            name: `org/model-${i}`,
            format: 'tgi',
            chatTemplate: '{{ messages }}',
            ...(chance(rng) ? { eosToken: '</s>' } : {}),
          };
    }
    if (chance(rng, 0.8)) {
      s.replicas = Array.from({ length: int(rng, 0, 3) }, () =>
        randomReplica(rng, `r${replicaSeq++}`, project.sshPrivateKey !== undefined),
      );
    }
    services.push(s);
  }
  doc.spec.services = services;
  if (chance(rng, 0.7)) {
    doc.spec.entrypoints = Array.from({ length: int(rng, 0, 2) }, (_, k) => ({
      project: pick(rng, projects).name,
      domain: `ep-${k}.gw.example.com`,
      ...(chance(rng) ? { https: chance(rng) } : {}),
    }));
  }
  return doc;
}

function randomReplica(rng: Rng, id: string, canSsh: boolean): ReplicaInput {
  const r: ReplicaInput = { id, appPort: int(rng, 1, 65535) };
  if (!canSsh || chance(rng, 0.3)) {
    r.direct = { host: `10.0.${int(rng, 0, 255)}.${int(rng, 1, 254)}`, port: int(rng, 1, 65535) };
    return r;
  }
  const hop = (host: string): { host: string; user: string; port?: number; hostKeyFingerprint?: string } => ({
    host,
    user: pick(rng, ['ubuntu', 'root', 'debian']),
    ...(chance(rng) ? { port: pick(rng, [22, 2222, 10022]) } : {}),
    ...(chance(rng, 0.3) ? { hostKeyFingerprint: FINGERPRINT } : {}),
  });
  r.ssh = hop(`host-${id}.example.net`);
  if (chance(rng, 0.4))
    r.sshProxy = { ...hop('jump.example.net'), ...(chance(rng) ? { privateKey: pick(rng, [TEST_KEY_C, TEST_KEY_D]) } : {}) };
  if (chance(rng, 0.2))
    r.sshHeadProxy = { ...hop('bastion.example.net'), ...(chance(rng) ? { privateKey: pick(rng, [TEST_KEY_C, TEST_KEY_D]) } : {}) };
  return r;
}

/** Flip the case of the fields normalise() lower-cases; everything else untouched. */
export function recased(rng: Rng, doc: ProxyStateInput): ProxyStateInput {
  const out = structuredClone(doc);
  const mix = (s: string): string => [...s].map((c) => (chance(rng) ? c.toUpperCase() : c.toLowerCase())).join('');
  for (const p of out.spec.projects ?? []) p.name = mix(p.name);
  for (const e of out.spec.entrypoints ?? []) {
    e.project = mix(e.project);
    e.domain = mix(e.domain);
  }
  for (const s of out.spec.services ?? []) {
    s.project = mix(s.project);
    s.run = mix(s.run);
    if (s.id !== undefined) s.id = mix(s.id);
    if (s.domain !== undefined) s.domain = mix(s.domain);
    for (const r of s.rateLimits ?? []) if (r.key.header !== undefined) r.key.header = mix(r.key.header);
    for (const r of s.replicas ?? []) {
      if (r.ssh) r.ssh.host = mix(r.ssh.host);
      if (r.sshProxy) r.sshProxy.host = mix(r.sshProxy.host);
      if (r.sshHeadProxy) r.sshHeadProxy.host = mix(r.sshHeadProxy.host);
      if (r.direct) r.direct.host = mix(r.direct.host);
    }
  }
  return out;
}
