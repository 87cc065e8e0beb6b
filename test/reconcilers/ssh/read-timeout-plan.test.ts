// The SSH loop's plan of per-service read timeouts: the document's `readTimeout` reaches the
// data plane as an `options:` action, only when it differs from what the data plane has, and
// goes back to the default when the document drops it (a removed service: once it stopped retiring).

import { describe, expect, it } from 'vitest';
import { createSshLoop } from '../../../src/reconcilers/ssh/index.js';
import type { StatusSnapshot } from '../../../src/reconcilers/types.js';
import { heldAs, specOf } from './harness.js';

const none: StatusSnapshot = { generation: 1, loops: {} };
const loop = createSshLoop({ stateDir: '/nonexistent' });

function spec(readTimeout: number | undefined) {
  const s = specOf('KEY', { app: [{ id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: 1 } }], other: [] });
  if (readTimeout !== undefined) s.spec.services[0]!.readTimeout = readTimeout;
  return s;
}

const held = heldAs;
const timeouts = (d: ReturnType<typeof loop.desired>) =>
  new Map(d.services.flatMap((s) => (s.readTimeoutMs === undefined ? [] : [[s.serviceKey, s.readTimeoutMs] as const])));

describe('read timeouts in the SSH plan', () => {
  it('sets a service’s own timeout, in ms, and plans nothing once the data plane has it', () => {
    const d = loop.desired(spec(1800), none);
    expect(timeouts(d)).toEqual(new Map([['main/app', 1_800_000]]));
    const actions = loop.plan(d, held(d));
    expect(actions.map((a) => [a.kind, a.key, a.summary, a.payload])).toEqual([
      [
        'create',
        'options:main/app',
        'read timeout of main/app: 1800 s',
        { what: 'options', serviceKey: 'main/app', readTimeoutMs: 1_800_000 },
      ],
    ]);
    expect(loop.plan(d, { ...held(d), readTimeouts: new Map([['main/app', 1_800_000]]) })).toEqual([]);
  });

  it('updates a changed timeout and resets a dropped one', () => {
    const d = loop.desired(spec(5), none);
    expect(loop.plan(d, { ...held(d), readTimeouts: new Map([['main/app', 1000]]) }).map((a) => [a.kind, a.payload])).toEqual([
      ['update', { what: 'options', serviceKey: 'main/app', readTimeoutMs: 5000 }],
    ]);
    const plain = loop.desired(spec(undefined), none);
    expect(timeouts(plain).size).toBe(0);
    expect(loop.plan(plain, { ...held(plain), readTimeouts: new Map([['main/app', 5000]]) }).map((a) => [a.kind, a.payload])).toEqual([
      ['delete', { what: 'options', serviceKey: 'main/app', readTimeoutMs: null }],
    ]);
  });

  it('keeps a removed service’s timeout while its socket still serves, resets it once closed', () => {
    const d = loop.desired(spec(5), none);
    const gone = { ...d, services: [] };
    const observed = { ...held(d), readTimeouts: new Map([['main/app', 5000]]) };
    expect(loop.plan(gone, observed).some((a) => a.key.startsWith('options:'))).toBe(false);
    const closed = { services: new Set<string>(), replicas: new Map(), readTimeouts: new Map([['main/app', 5000]]) };
    expect(loop.plan(gone, closed).map((a) => a.key)).toEqual(['options:main/app']);
  });
});
