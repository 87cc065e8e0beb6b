// The mapper's cost per call on a 10,000-service document, beside what the routes add around
// it (normalise, hash, validate of the whole candidate, or of the call's probe document). Run: npx vitest bench --run test/compat/dstack/mapper.bench.ts

import { bench, describe } from 'vitest';
import { applyCall } from '../../../src/compat/dstack/mapper.js';
import { parseCall } from '../../../src/compat/dstack/requests.js';
import { DSTACK_OWNER, type Call } from '../../../src/compat/dstack/calls.js';
import { emptyState, hashSpec, normalise, validate, type ProxyState, type Service } from '../../../src/spec/index.js';
import { dstackId, dstackProjectKey, registerServicePayload, vmReplicaPayload } from './fixtures.js';

const key = dstackProjectKey();
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
const base: ProxyState = {
  ...emptyState(),
  spec: { ...emptyState().spec, projects: [{ name: 'main', sshPrivateKey: key.privateKey }], services },
};

function parsed(r: ReturnType<typeof parseCall>): Call {
  if (!r.ok) throw new Error(JSON.stringify(r.detail));
  return r.call;
}

const servicePayload = registerServicePayload({ sshPrivateKey: key.privateKey, runName: 'svc-05000x', domain: 'new.example.test' });
const register = parsed(parseCall('registerService', { project: 'main' }, servicePayload));
const registered = applyCall(base, register);
if (registered.kind !== 'changed') throw new Error('expected a change');
const withService = registered.state;
const replica = parsed(parseCall('registerReplica', { project: 'main', run: 'svc-05000x' }, vmReplicaPayload({ jobId: 'job-new' })));

describe('10,000 services', () => {
  bench('parseCall registerService', () => void parseCall('registerService', { project: 'main' }, servicePayload));
  bench('applyCall registerService', () => void applyCall(base, register));
  bench('applyCall registerReplica', () => void applyCall(withService, replica));
  bench('normalise(candidate)', () => void normalise(withService), { iterations: 10 });
  bench('hashSpec(candidate)', () => void hashSpec(withService), { iterations: 10 });
  bench('validate(candidate)', () => void validate(withService), { iterations: 5 });
  bench('validate(probe)', () => void validate(registered.probe));
});
