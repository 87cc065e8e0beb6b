// The mapper on dstack's payloads (parsed as the routes parse them): each call's document
// change, identical re-sends, unknown ids, dstack's texts, ownership, entrypoint upserts. Every
// candidate must pass validate() (PKCS#8 project keys included) and already be normalised.

import { beforeAll, describe, expect, test } from 'vitest';
import { applyCall, describeCall, listServices, type Outcome } from '../../../src/compat/dstack/mapper.js';
import { parseCall, type CallKind, type PathParams } from '../../../src/compat/dstack/requests.js';
import { DSTACK_OWNER, type Call } from '../../../src/compat/dstack/calls.js';
import * as texts from '../../../src/compat/dstack/texts.js';
import { LETS_ENCRYPT_PRODUCTION, emptyState, normalise, validate, type ProxyState, type Service } from '../../../src/spec/index.js';
import {
  dockerReplicaPayload,
  dstackId,
  dstackProjectKey,
  entrypointPayload,
  headProxyReplicaPayload,
  headerRateLimit,
  ipRateLimit,
  openaiModel,
  pebbleConfigPayload,
  configPayload,
  registerServicePayload,
  setIdPayload,
  tgiModel,
  vmReplicaPayload,
  type DstackKey,
  type RegisterServiceOptions,
} from './fixtures.js';
import { TEST_KEY_A } from '../../helpers/keys.js';

let key: DstackKey;
let otherKey: DstackKey;
beforeAll(() => {
  key = dstackProjectKey();
  otherKey = dstackProjectKey();
});

function call(route: CallKind, params: PathParams, body?: unknown): Call {
  const r = parseCall(route, params, body);
  if (!r.ok) throw new Error(JSON.stringify(r.detail));
  return r.call;
}

/** applyCall, checking what the routes rely on: the input untouched, a candidate valid and already normalised. */
function apply(state: ProxyState, c: Call): Outcome {
  const before = JSON.stringify(state);
  const out = applyCall(state, c);
  expect(JSON.stringify(state)).toBe(before);
  if (out.kind === 'changed') {
    const v = validate(out.state);
    if (!v.ok) throw new Error(`candidate invalid after ${describeCall(c)}: ${JSON.stringify(v.errors)}`);
    expect(JSON.stringify(out.state)).toBe(JSON.stringify(normalise(out.state)));
    expect(out.probe && validate(out.probe).ok).toBe(true);
  }
  return out;
}

function next(state: ProxyState, c: Call): ProxyState {
  const out = apply(state, c);
  if (out.kind !== 'changed') throw new Error(`expected a change from ${describeCall(c)}, got ${JSON.stringify(out)}`);
  return out.state;
}

function service(state: ProxyState, project: string, run: string): Service | undefined {
  return state.spec.services.find((s) => s.project === project && s.run === run);
}

const regService = (project: string, o: Partial<RegisterServiceOptions> = {}): Call =>
  call('registerService', { project }, registerServicePayload({ sshPrivateKey: key.privateKey, project, ...o }));

/** A document with an operator's service (no owner) and one of another writer, both on project main. */
function withOperatorServices(): ProxyState {
  const doc = {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      acme: { server: LETS_ENCRYPT_PRODUCTION, email: 'ops@example.test' },
      projects: [{ name: 'main', sshPrivateKey: TEST_KEY_A }],
      services: [
        {
          project: 'main',
          run: 'ops-svc',
          domain: 'ops.example.test',
          https: false,
          replicas: [{ id: 'ops-1', appPort: 80, direct: { host: '127.0.0.1', port: 9000 } }],
        },
        { project: 'main', run: 'other-svc', owner: 'someone-else', domain: 'other.example.test', https: false, replicas: [] },
      ],
    },
  };
  const v = validate(doc);
  if (!v.ok) throw new Error(JSON.stringify(v.errors));
  return v.state;
}

describe('config', () => {
  test('null values mean Let’s Encrypt: the empty document already says so', () => {
    expect(apply(emptyState(), call('config', {}, configPayload()))).toEqual({ kind: 'same' });
  });

  test('a Pebble URL with EAB, then the same again; an operator’s email is kept', () => {
    const start = withOperatorServices();
    const c = call('config', {}, pebbleConfigPayload('https://127.0.0.1:14000/dir', { kid: 'kid-1', hmacKey: 'aG1hYy1rZXk' }));
    const s1 = next(start, c);
    expect(s1.spec.acme).toEqual({
      server: 'https://127.0.0.1:14000/dir',
      eabKid: 'kid-1',
      eabHmacKey: 'aG1hYy1rZXk',
      email: 'ops@example.test',
    });
    expect(s1.spec.services).toBe(start.spec.services);
    expect(apply(s1, c)).toEqual({ kind: 'same' });
    const s2 = next(s1, call('config', {}, configPayload()));
    expect(s2.spec.acme).toEqual({ server: LETS_ENCRYPT_PRODUCTION, email: 'ops@example.test' });
  });
});

describe('services/register', () => {
  test('an openai model, rate limits, auth: the service, its project with the PKCS#8 key, the list', () => {
    const id = dstackId();
    const c = regService('main', {
      id,
      runName: 'llama',
      domain: 'llama.main.example.test',
      auth: true,
      model: openaiModel({ prefix: '/openai/v1' }),
      rateLimits: [headerRateLimit('X-API-Key'), ipRateLimit({ prefix: '/' })],
    });
    const s = next(emptyState(), c);
    expect(s.spec.projects).toEqual([{ name: 'main', sshPrivateKey: key.privateKey }]);
    expect(key.privateKey).toMatch(/^-----BEGIN PRIVATE KEY-----/);
    expect(service(s, 'main', 'llama')).toEqual({
      project: 'main',
      run: 'llama',
      id,
      owner: DSTACK_OWNER,
      domain: 'llama.main.example.test',
      https: false,
      auth: true,
      clientMaxBodySize: 64 * 1024 * 1024,
      stripPrefix: true,
      rateLimits: [
        { prefix: '/', key: { type: 'ipAddress' }, rps: 2.5, burst: 5 },
        { prefix: '/v1/chat/completions', key: { type: 'header', header: 'x-api-key' }, rps: 10, burst: 0 },
      ],
      model: { name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/openai/v1' },
      replicas: [],
    });
    expect(listServices(s)).toEqual({ services: [{ id, project_name: 'main', run_name: 'llama', replicas: [] }] });
    expect(apply(s, c)).toEqual({ kind: 'same' });
  });

  test('a tgi model, https, a router replica', () => {
    const s = next(emptyState(), regService('main', { runName: 'tgi', https: true, model: tgiModel(), hasRouterReplica: true }));
    const svc = service(s, 'main', 'tgi');
    expect(svc?.model).toEqual({
      name: 'mistralai/Mistral-7B-Instruct-v0.2',
      format: 'tgi',
      chatTemplate: tgiModel().chat_template,
      eosToken: '</s>',
    });
    expect([svc?.https, svc?.routerAllowlist]).toEqual([true, true]);
    const plain = next(emptyState(), regService('main', { runName: 'plain', model: null, hasRouterReplica: false }));
    expect(service(plain, 'main', 'plain')).not.toHaveProperty('routerAllowlist');
    expect(service(plain, 'main', 'plain')).not.toHaveProperty('model');
  });

  test('the same id with a changed spec is updated in place, replicas kept; a new key overwrites the project’s', () => {
    const id = dstackId();
    let s = next(emptyState(), regService('main', { id, runName: 'llama' }));
    s = next(s, call('registerReplica', { project: 'main', run: 'llama' }, vmReplicaPayload({ jobId: 'job1' })));
    const changed = call(
      'registerService',
      { project: 'main' },
      registerServicePayload({ sshPrivateKey: otherKey.privateKey, id, runName: 'llama', https: true, rateLimits: [ipRateLimit()] }),
    );
    const s2 = next(s, changed);
    const svc = service(s2, 'main', 'llama');
    expect([svc?.https, svc?.rateLimits.length, svc?.replicas.map((r) => r.id)]).toEqual([true, 1, ['job1']]);
    expect(s2.spec.projects).toEqual([{ name: 'main', sshPrivateKey: otherKey.privateKey }]);
    // A pre-0.21 caller sends no id: the service keeps the one it has.
    const s3 = next(s2, regService('main', { id: null, runName: 'llama', https: false }));
    expect(service(s3, 'main', 'llama')?.id).toBe(id);
  });

  test("the same name with another id: dstack's text", () => {
    const s = next(emptyState(), regService('main', { runName: 'llama' }));
    expect(apply(s, regService('main', { runName: 'llama' }))).toEqual({
      kind: 'refused',
      detail: 'Service main/llama is already registered',
    });
  });

  test("an operator's or another writer's service is never taken over", () => {
    const start = withOperatorServices();
    for (const run of ['ops-svc', 'other-svc']) {
      expect(apply(start, regService('main', { runName: run, domain: `${run}.new.example.test` }))).toEqual({
        kind: 'refused',
        detail: `Service main/${run} is already registered`,
      });
    }
    expect(listServices(start)).toEqual({ services: [] });
  });

  test('a domain held by another service or by an entrypoint', () => {
    const start = withOperatorServices();
    const taken = { kind: 'refused', detail: "Domain name 'ops.example.test' is already taken by another service" };
    expect(apply(start, regService('main', { runName: 'mine', domain: 'OPS.example.test' }))).toEqual(taken);
    const s = next(start, call('registerEntrypoint', { project: 'other' }, entrypointPayload({ domain: 'gw.example.test' })));
    expect(apply(s, regService('main', { runName: 'mine', domain: 'gw.example.test' }))).toEqual({
      kind: 'refused',
      detail: "Domain name 'gw.example.test' is already taken by another service",
    });
  });

  test('a legacy router is refused with a sentence', () => {
    const c = call(
      'registerService',
      { project: 'main' },
      { ...registerServicePayload({ sshPrivateKey: key.privateKey }), router: { type: 'sglang' } },
    );
    expect(apply(emptyState(), c)).toEqual({ kind: 'refused', detail: 'Gateway-based routers are not supported' });
  });

  test('services are inserted in document order, and untouched ones are shared, not copied', () => {
    let s = emptyState();
    for (const run of ['c', 'a', 'b']) s = next(s, regService('p2', { runName: run }));
    s = next(s, regService('p1', { runName: 'z' }));
    expect(s.spec.services.map((x) => `${x.project}/${x.run}`)).toEqual(['p1/z', 'p2/a', 'p2/b', 'p2/c']);
    const s2 = next(s, call('registerReplica', { project: 'p2', run: 'b' }, vmReplicaPayload()));
    expect(s2.spec.services[0]).toBe(s.spec.services[0]);
    expect(s2.spec.services[1]).toBe(s.spec.services[1]);
    expect(s2.spec.services[3]).toBe(s.spec.services[3]);
    expect(s2.spec.projects).toBe(s.spec.projects);
  });
});

describe('services/unregister and set_id', () => {
  test('removes ours, keeps the project and entrypoints; unknown or not ours is a no-op', () => {
    let s = next(
      withOperatorServices(),
      call('registerEntrypoint', { project: 'main' }, entrypointPayload({ domain: 'gateway.main.example.test' })),
    );
    s = next(s, regService('main', { runName: 'llama' }));
    const s2 = next(s, call('unregisterService', { project: 'main', run: 'llama' }));
    expect(service(s2, 'main', 'llama')).toBeUndefined();
    expect(s2.spec.projects).toBe(s.spec.projects);
    expect(s2.spec.entrypoints).toEqual([{ project: 'main', domain: 'gateway.main.example.test', https: false }]);
    for (const run of ['llama', 'ops-svc', 'other-svc', 'never']) {
      expect(apply(s2, call('unregisterService', { project: 'main', run }))).toEqual({ kind: 'same' });
    }
    expect(s2.spec.services.map((x) => x.run)).toEqual(['ops-svc', 'other-svc']);
  });

  test("set_id: fills a legacy service's id; dstack's texts otherwise", () => {
    const s = next(withOperatorServices(), regService('main', { runName: 'legacy', id: null }));
    expect(listServices(s).services).toEqual([{ id: null, project_name: 'main', run_name: 'legacy', replicas: [] }]);
    const id = dstackId();
    const s2 = next(s, call('setServiceId', { project: 'main', run: 'legacy' }, setIdPayload(id)));
    expect(service(s2, 'main', 'legacy')?.id).toBe(id);
    expect(apply(s2, call('setServiceId', { project: 'main', run: 'legacy' }, setIdPayload(id)))).toEqual({ kind: 'same' });
    expect(apply(s2, call('setServiceId', { project: 'main', run: 'legacy' }, setIdPayload()))).toEqual({
      kind: 'refused',
      detail: 'Service main/legacy already has an ID',
    });
    for (const run of ['nope', 'ops-svc']) {
      expect(apply(s2, call('setServiceId', { project: 'main', run }, setIdPayload()))).toEqual({
        kind: 'refused',
        detail: `Service main/${run} does not exist, cannot set ID`,
      });
    }
  });
});

describe('replicas/register and unregister', () => {
  let base: ProxyState;
  beforeAll(() => {
    base = next(withOperatorServices(), regService('main', { runName: 'llama' }));
  });
  const at = { project: 'main', run: 'llama' };

  test('a VM replica: user@host split at the last @, per-replica host keys, internal_ip ignored', () => {
    const s = next(
      base,
      call('registerReplica', at, vmReplicaPayload({ jobId: 'job-vm', appPort: 8080, user: 'ubuntu', host: '127.0.0.1', sshPort: 2222 })),
    );
    expect(service(s, 'main', 'llama')?.replicas).toEqual([
      { id: 'job-vm', appPort: 8080, hostKeyPolicy: 'tofu-per-replica', ssh: { host: '127.0.0.1', port: 2222, user: 'ubuntu' } },
    ]);
    expect(listServices(s).services).toEqual([
      { id: service(s, 'main', 'llama')?.id, project_name: 'main', run_name: 'llama', replicas: [{ id: 'job-vm' }] },
    ]);
    const named = next(base, call('registerReplica', at, { ...vmReplicaPayload({ jobId: 'job-at' }), ssh_host: 'ec2-user@Host.Example' }));
    expect(service(named, 'main', 'llama')?.replicas[0]?.ssh).toEqual({ host: 'host.example', port: 22, user: 'ec2-user' });
    // Split at the last '@': a user holding one is the document's to refuse (with a path), not a 500.
    const odd = applyCall(base, call('registerReplica', at, { ...vmReplicaPayload({ jobId: 'job-odd' }), ssh_host: 'a@b@host' }));
    expect(odd.kind === 'changed' && service(odd.state, 'main', 'llama')?.replicas[0]?.ssh).toEqual({
      host: 'host',
      port: 22,
      user: 'a@b',
    });
  });

  test('dockerized: root@localhost through the VM as ssh_proxy, with the project key or its own', () => {
    const s = next(
      base,
      call('registerReplica', at, dockerReplicaPayload({ jobId: 'job-docker', containerSshPort: 2300, vm: { port: 2222 } })),
    );
    expect(service(s, 'main', 'llama')?.replicas).toEqual([
      {
        id: 'job-docker',
        appPort: 8000,
        hostKeyPolicy: 'tofu-per-replica',
        ssh: { host: 'localhost', port: 2300, user: 'root' },
        sshProxy: { host: '127.0.0.1', port: 2222, user: 'ubuntu' },
      },
    ]);
    const imported = next(base, call('registerReplica', at, dockerReplicaPayload({ jobId: 'job-imp', vmKey: otherKey.privateKey })));
    expect(service(imported, 'main', 'llama')?.replicas[0]?.sshProxy).toEqual({
      host: '127.0.0.1',
      port: 22,
      user: 'ubuntu',
      privateKey: otherKey.privateKey,
    });
  });

  test('behind an SSH fleet head node, with its key', () => {
    const s = next(
      base,
      call('registerReplica', at, headProxyReplicaPayload({ jobId: 'job-head', headKey: otherKey.privateKey, head: { port: 2201 } })),
    );
    expect(service(s, 'main', 'llama')?.replicas[0]).toEqual({
      id: 'job-head',
      appPort: 8000,
      hostKeyPolicy: 'tofu-per-replica',
      ssh: { host: '10.0.1.7', port: 22, user: 'ubuntu' },
      sshHeadProxy: { host: '127.0.0.1', port: 2201, user: 'ubuntu', privateKey: otherKey.privateKey },
    });
  });

  test("identical re-send is a no-op; another payload under the same id is dstack's text", () => {
    const payload = vmReplicaPayload({ jobId: 'job1' });
    const s = next(base, call('registerReplica', at, payload));
    expect(apply(s, call('registerReplica', at, payload))).toEqual({ kind: 'same' });
    // internal_ip is not part of the mapping: a different one is still the same replica.
    expect(apply(s, call('registerReplica', at, { ...payload, internal_ip: '10.9.9.9' }))).toEqual({ kind: 'same' });
    expect(apply(s, call('registerReplica', at, { ...payload, app_port: 9999 }))).toEqual({
      kind: 'refused',
      detail: 'Replica job1 already exists in service main/llama',
    });
  });

  test('an unknown service, an operator’s, a job id of another service, a host without a user', () => {
    for (const run of ['nope', 'ops-svc', 'other-svc']) {
      expect(apply(base, call('registerReplica', { project: 'main', run }, vmReplicaPayload({ jobId: 'j' })))).toEqual({
        kind: 'refused',
        detail: `Service main/${run} does not exist, cannot register replica`,
      });
    }
    expect(apply(base, call('registerReplica', at, vmReplicaPayload({ jobId: 'ops-1' })))).toEqual({
      kind: 'refused',
      detail: 'Cannot register replica ops-1 in service main/llama: replica id ops-1 is already used by service main/ops-svc',
    });
    expect(apply(base, call('registerReplica', at, { ...vmReplicaPayload({ jobId: 'j2' }), ssh_host: '127.0.0.1' }))).toEqual({
      kind: 'refused',
      detail: 'Cannot register replica j2 in service main/llama: ssh_host must be "user@host"; got "127.0.0.1"',
    });
  });

  test('unregister removes it; unknown replica, unknown or foreign service: no-op', () => {
    let s = next(base, call('registerReplica', at, vmReplicaPayload({ jobId: 'a1' })));
    s = next(s, call('registerReplica', at, vmReplicaPayload({ jobId: 'a0' })));
    expect(service(s, 'main', 'llama')?.replicas.map((r) => r.id)).toEqual(['a0', 'a1']);
    const s2 = next(s, call('unregisterReplica', { ...at, jobId: 'a1' }));
    expect(service(s2, 'main', 'llama')?.replicas.map((r) => r.id)).toEqual(['a0']);
    expect(apply(s2, call('unregisterReplica', { ...at, jobId: 'a1' }))).toEqual({ kind: 'same' });
    expect(apply(s2, call('unregisterReplica', { project: 'main', run: 'nope', jobId: 'a0' }))).toEqual({ kind: 'same' });
    expect(apply(s2, call('unregisterReplica', { project: 'main', run: 'ops-svc', jobId: 'ops-1' }))).toEqual({ kind: 'same' });
  });
});

describe('entrypoints/register', () => {
  test('creates the project without a key; identical is a no-op', () => {
    const c = call('registerEntrypoint', { project: 'team' }, entrypointPayload({ domain: 'gateway.team.example.test', https: true }));
    const s = next(emptyState(), c);
    expect(s.spec.projects).toEqual([{ name: 'team' }]);
    expect(s.spec.entrypoints).toEqual([{ project: 'team', domain: 'gateway.team.example.test', https: true }]);
    expect(apply(s, c)).toEqual({ kind: 'same' });
    // The server registers the entrypoint before every service with a model: no churn.
    const s2 = next(s, regService('team', { runName: 'llama', domain: 'llama.team.example.test' }));
    expect(apply(s2, c)).toEqual({ kind: 'same' });
  });

  test('one per project, last writer wins across projects', () => {
    let s = next(emptyState(), call('registerEntrypoint', { project: 'a' }, entrypointPayload({ domain: 'gw1.example.test' })));
    s = next(s, call('registerEntrypoint', { project: 'a' }, entrypointPayload({ domain: 'gw2.example.test' })));
    expect(s.spec.entrypoints).toEqual([{ project: 'a', domain: 'gw2.example.test', https: false }]);
    s = next(s, call('registerEntrypoint', { project: 'b' }, entrypointPayload({ domain: 'gw2.example.test', https: true })));
    expect(s.spec.entrypoints).toEqual([{ project: 'b', domain: 'gw2.example.test', https: true }]);
    s = next(s, call('registerEntrypoint', { project: 'c' }, entrypointPayload({ domain: 'gw0.example.test' })));
    expect(s.spec.entrypoints.map((e) => e.domain)).toEqual(['gw0.example.test', 'gw2.example.test']);
    expect(s.spec.projects.map((p) => p.name)).toEqual(['a', 'b', 'c']);
  });

  test("a service's domain is refused with dstack's text", () => {
    const s = next(emptyState(), regService('main', { runName: 'llama', domain: 'llama.example.test' }));
    expect(apply(s, call('registerEntrypoint', { project: 'other' }, entrypointPayload({ domain: 'llama.example.test' })))).toEqual({
      kind: 'refused',
      detail: "Domain name 'llama.example.test' is already taken by another service",
    });
  });
});

describe('texts and logs', () => {
  test("dstack's texts, verbatim", () => {
    expect(texts.serviceAlreadyRegistered('p', 'r')).toBe('Service p/r is already registered');
    expect(texts.domainTaken('a.example')).toBe("Domain name 'a.example' is already taken by another service");
    expect(texts.serviceMissingCannotRegisterReplica('p', 'r')).toBe('Service p/r does not exist, cannot register replica');
    expect(texts.replicaAlreadyExists('j', 'p', 'r')).toBe('Replica j already exists in service p/r');
    expect(texts.cannotRegisterReplica('j', 'p', 'r', 'auth refused\nby host')).toBe(
      'Cannot register replica j in service p/r: auth refused by host',
    );
    expect(texts.certificateTimedOut('a.example', 40)).toBe(
      'Could not obtain a.example TLS certificate in 40s. Make sure DNS records are configured for this gateway.',
    );
    expect(texts.certificateFailed('a.example', 'DNS problem:\nNXDOMAIN\n')).toBe(
      'Error obtaining a.example TLS certificate: DNS problem: NXDOMAIN',
    );
    expect(texts.serviceMissingCannotSetId('p', 'r')).toBe('Service p/r does not exist, cannot set ID');
    expect(texts.serviceAlreadyHasId('p', 'r')).toBe('Service p/r already has an ID');
    expect(texts.serviceNotRegistered('p', 'r')).toBe('Service p/r is not registered, cannot unregister');
    expect(texts.serviceMissingCannotUnregisterReplica('p', 'r')).toBe('Service p/r does not exist, cannot unregister replica');
    expect(texts.replicaMissingCannotUnregister('j', 'p', 'r')).toBe('Replica j does not exist in service p/r, cannot unregister');
    expect(texts.ROUTERS_NOT_SUPPORTED).toBe('Gateway-based routers are not supported');
  });

  test('describeCall names the call and never a key', () => {
    const calls = [
      regService('main', { runName: 'llama' }),
      call('registerReplica', { project: 'main', run: 'llama' }, dockerReplicaPayload({ vmKey: otherKey.privateKey, jobId: 'j1' })),
      call('registerReplica', { project: 'main', run: 'llama' }, headProxyReplicaPayload({ headKey: otherKey.privateKey })),
      call(
        'config',
        {},
        pebbleConfigPayload('https://acme:c2VjcmV0LWhtYWMta2V5@127.0.0.1:14000/dir', { kid: 'k', hmacKey: 'c2VjcmV0LWhtYWMta2V5' }),
      ),
    ];
    const lines = calls.map(describeCall);
    expect(lines[0]).toMatch(/^register service main\/llama id=[0-9a-f]{32} domain=llama\.main\.example\.test/);
    expect(lines[1]).toBe('register replica j1 of main/llama at root@localhost:10022 via ubuntu@127.0.0.1:22 port 8000');
    expect(lines[3]).toBe('config acme_server=https://127.0.0.1:14000/dir eab=yes');
    for (const line of lines) {
      expect(line).not.toContain('PRIVATE KEY');
      expect(line).not.toContain('c2VjcmV0LWhtYWMta2V5');
      for (const k of [key, otherKey]) expect(line).not.toContain(k.privateKey.split('\n')[1]);
    }
  });
});

describe('a 10,000-service document', () => {
  test('a call copies only the list it changes and the service it touches', () => {
    let s = emptyState();
    const services: Service[] = [];
    for (let i = 0; i < 10_000; i++) {
      const run = `svc-${String(i).padStart(5, '0')}`;
      services.push({
        project: 'main',
        run,
        id: dstackId(),
        owner: DSTACK_OWNER,
        domain: `${run}.example.test`,
        https: false,
        auth: true,
        clientMaxBodySize: 1024,
        stripPrefix: true,
        rateLimits: [],
        replicas: [{ id: `job-${i}`, appPort: 80, hostKeyPolicy: 'tofu-per-replica', ssh: { host: '127.0.0.1', port: 22, user: 'u' } }],
      });
    }
    s = { ...s, spec: { ...s.spec, projects: [{ name: 'main', sshPrivateKey: key.privateKey }], services } };
    // applyCall alone: validate() of 10,000 services is the routes' cost, covered on small documents above.
    const step = (from: ProxyState, c: Call): ProxyState => {
      const out = applyCall(from, c);
      if (out.kind !== 'changed') throw new Error(JSON.stringify(out));
      return out.state;
    };
    const s2 = step(s, regService('main', { runName: 'svc-05000x', domain: 'new.example.test' }));
    expect(s2.spec.services.length).toBe(10_001);
    expect(s2.spec.services[5001]?.run).toBe('svc-05000x');
    expect(s2.spec.services[5000]).toBe(services[5000]);
    expect(s2.spec.services[5002]).toBe(services[5001]);
    const s3 = step(s2, call('registerReplica', { project: 'main', run: 'svc-05000x' }, vmReplicaPayload({ jobId: 'job-new' })));
    expect(s3.spec.services.filter((x, i) => x !== s2.spec.services[i]).map((x) => x.run)).toEqual(['svc-05000x']);
    expect(applyCall(s3, call('registerReplica', { project: 'main', run: 'svc-05000x' }, vmReplicaPayload({ jobId: 'job-9999' })))).toEqual(
      {
        kind: 'refused',
        detail:
          'Cannot register replica job-9999 in service main/svc-05000x: replica id job-9999 is already used by service main/svc-09999',
      },
    );
    expect(JSON.stringify(s3.spec.services[5001])).toBe(JSON.stringify(normalise(s3).spec.services[5001]));
  });
});

describe('the probe document', () => {
  let base: ProxyState;
  beforeAll(() => {
    base = next(withOperatorServices(), regService('main', { runName: 'llama' }));
  });
  const at = { project: 'main', run: 'llama' };

  /** Payloads dstack accepts and our document does not: the probe must refuse each as the whole candidate does. */
  const invalid: [string, () => Call][] = [
    ['a header name with an underscore', () => regService('main', { runName: 'h', rateLimits: [headerRateLimit('X_Api_Key')] })],
    ["a prefix with ';'", () => regService('main', { runName: 'p', rateLimits: [ipRateLimit({ prefix: '/a;b' })] })],
    ['a zero rps', () => regService('main', { runName: 'z', rateLimits: [ipRateLimit({ rps: 0 })] })],
    ['a negative body size', () => regService('main', { runName: 'b', clientMaxBodySize: -1 })],
    [
      'an unusable project key',
      () => call('registerService', { project: 'main' }, registerServicePayload({ sshPrivateKey: 'not a key', runName: 'k' })),
    ],
    ['a run name the document cannot hold', () => regService('main', { runName: 'has.dot' })],
    ['a project name the document cannot hold', () => regService('has.dot', { runName: 'x' })],
    ['a bad domain', () => regService('main', { runName: 'd', domain: 'under_score.example.test' })],
    ['an app port out of range', () => call('registerReplica', at, vmReplicaPayload({ appPort: 70000 }))],
    ['a proxy key that is not a key', () => call('registerReplica', at, dockerReplicaPayload({ vmKey: 'garbage' }))],
    ['a user the document refuses', () => call('registerReplica', at, { ...vmReplicaPayload(), ssh_host: 'a@b@host' })],
    ['a wildcard entrypoint', () => call('registerEntrypoint', { project: 'main' }, entrypointPayload({ domain: '*.example.test' }))],
    ['an EAB kid without its key', () => call('config', {}, configPayload({ acme_eab_kid: 'kid' }))],
    ['an ACME URL the document refuses', () => call('config', {}, configPayload({ acme_server: 'https://acme.example/{dir}' }))],
  ];
  test.each(invalid)('%s: refused by the probe and by the whole candidate alike', (_name, make) => {
    const out = applyCall(base, make());
    if (out.kind !== 'changed') throw new Error(JSON.stringify(out));
    const whole = validate(out.state);
    expect(out.probe).toBeDefined();
    const probe = validate(out.probe);
    expect([whole.ok, probe.ok]).toEqual([false, false]);
    const messages = (r: typeof whole): string[] => (r.ok ? [] : r.errors.map((e) => e.message));
    expect(messages(probe)).toEqual(messages(whole));
  });

  test('holds only what the call wrote', () => {
    const out = applyCall(base, call('registerReplica', at, vmReplicaPayload({ jobId: 'job1' })));
    if (out.kind !== 'changed') throw new Error(JSON.stringify(out));
    expect(out.probe?.spec.services.map((s) => s.run)).toEqual(['llama']);
    expect(out.probe?.spec.projects.map((p) => p.name)).toEqual(['main']);
    expect(out.probe?.spec.entrypoints).toEqual([]);
  });
});
