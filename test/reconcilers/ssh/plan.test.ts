// The pure half of the SSH loop: desired from the spec, plan against what is held.

import { describe, expect, it } from 'vitest';
import { createSshLoop } from '../../../src/reconcilers/ssh/index.js';
import { HostKeyBook, sha256Fingerprint } from '../../../src/reconcilers/ssh/host-keys.js';
import { planDifference, planSsh, type ConvergedServices, type ServiceFacts } from '../../../src/reconcilers/ssh/plan.js';
import { desiredFromSpec, describeTarget } from '../../../src/reconcilers/ssh/targets.js';
import type { StatusSnapshot } from '../../../src/reconcilers/types.js';
import { desiredReplica, heldAs, specOf } from './harness.js';

const KEY = '-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n-----END OPENSSH PRIVATE KEY-----\n';
const ssh = { host: '10.0.0.1', port: 22, user: 'ubuntu' };
const none: StatusSnapshot = { generation: 1, loops: {} };

describe('desiredFromSpec', () => {
  it('orders hops head proxy → proxy → destination, with per-hop keys defaulting to the project key', () => {
    const d = desiredFromSpec(
      specOf(KEY, {
        app: [
          {
            id: 'r1',
            appPort: 8000,
            ssh,
            sshProxy: { host: 'jump', port: 2222, user: 'root' },
            sshHeadProxy: { host: 'bastion', port: 22, user: 'b', privateKey: 'HEADKEY' },
          },
        ],
      }),
    );
    const t = d.replicas.get('r1')!.target;
    expect(t.kind === 'ssh' && t.hops.map((h) => [h.host, h.privateKey])).toEqual([
      ['bastion', 'HEADKEY'],
      ['jump', KEY],
      ['10.0.0.1', KEY],
    ]);
    expect(describeTarget(t)).toBe('b@bastion:22 → root@jump:2222 → ubuntu@10.0.0.1:22 → localhost:8000');
    expect(describeTarget(t)).not.toContain('KEY');
  });

  it('changes the fingerprint when a connection parameter or key changes, not otherwise', () => {
    const fp = (spec: ReturnType<typeof specOf>) => desiredFromSpec(spec).replicas.get('r1')!.fingerprint;
    const base = fp(specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }] }));
    expect(fp(specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }] }))).toBe(base);
    expect(fp(specOf(KEY, { app: [{ id: 'r1', appPort: 8001, ssh }] }))).not.toBe(base);
    expect(fp(specOf(KEY + 'x', { app: [{ id: 'r1', appPort: 8000, ssh }] }))).not.toBe(base);
    expect(fp(specOf(KEY, { other: [{ id: 'r1', appPort: 8000, ssh }] }))).not.toBe(base);
  });

  it('reuses the replicas of an unchanged service object, and builds them again when its project key changes', () => {
    const spec = specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }] });
    const first = desiredFromSpec(spec).replicas.get('r1')!;
    expect(desiredFromSpec(spec).replicas.get('r1')).toBe(first);
    const rekeyed = { ...spec, spec: { ...spec.spec, projects: spec.spec.projects.map((p) => ({ ...p, sshPrivateKey: KEY + 'x' })) } };
    const again = desiredFromSpec(rekeyed).replicas.get('r1')!;
    expect(again).not.toBe(first);
    expect(again.fingerprint).not.toBe(first.fingerprint);
    expect(desiredFromSpec(spec, 'other-host').replicas.get('r1')!.fingerprint).not.toBe(first.fingerprint);
  });

  it('reports a replica without a usable key as a problem', () => {
    const d = desiredFromSpec(specOf('', { app: [{ id: 'r1', appPort: 8000, ssh }] }));
    expect(d.replicas.get('r1')!.problem).toMatch(/no private key/);
  });
});

describe('plan', () => {
  const loop = createSshLoop({ stateDir: '/nonexistent' });
  const spec = specOf(KEY, {
    app: [
      { id: 'r1', appPort: 8000, ssh },
      { id: 'r2', appPort: 8000, direct: { host: '10.0.0.2', port: 8000 } },
    ],
  });
  const desired = loop.desired(spec, none);

  it('creates a socket per service and a tunnel per replica from nothing', () => {
    const actions = loop.plan(desired, { services: new Set(), replicas: new Map() });
    expect(actions.map((a) => `${a.kind} ${a.key}`)).toEqual(['create service:main/app', 'create replica:r1', 'create replica:r2']);
    for (const a of actions) expect(a.summary).not.toContain('secret');
  });

  it('plans nothing when what is held matches', () => {
    expect(loop.plan(desired, heldAs(desired))).toEqual([]);
  });

  it('reopens a changed replica and closes removed ones and their services', () => {
    const actions = loop.plan(loop.desired(specOf(KEY, { app: [{ id: 'r1', appPort: 9000, ssh }] }), none), {
      services: new Set(['main/app', 'main/gone']),
      replicas: new Map([
        ['r1', { serviceKey: 'main/app', fingerprint: 'old' }],
        ['r9', { serviceKey: 'main/gone', fingerprint: 'x' }],
      ]),
    });
    expect(actions.map((a) => `${a.kind} ${a.key}`)).toEqual(['delete service:main/gone', 'update replica:r1', 'delete replica:r9']);
  });
});

describe('plan with a router (the gateway: Nginx routes to the sockets)', () => {
  const loop = createSshLoop({ stateDir: '/nonexistent', routedBy: 'nginx', drainMs: 30_000 });
  const routed = (gen: number): StatusSnapshot => ({
    generation: 3,
    loops: {
      nginx: {
        conditions: [
          { type: 'Ready', status: 'True', reason: 'Converged', message: '', lastTransitionTime: new Date(0), observedGeneration: gen },
        ],
        objects: {},
        failures: {},
      },
    },
  });
  const desired = (gen: number) => loop.desired(specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }] }), routed(gen));
  const held = { serviceKey: 'main/app', fingerprint: desiredReplica(desired(0), 'r1')!.fingerprint };
  const retiring = (at: number) => new Map([['main/gone', { since: 3, at, caughtUpAt: null, replicas: new Set(['r9']) }]]);

  it('watches the router and keeps a retiring socket until the router has served a generation without it', () => {
    expect(loop.watches).toEqual(['nginx']);
    const observed = {
      services: new Set(['main/app', 'main/gone']),
      replicas: new Map([['r1', held]]),
      retiring: retiring(1_000),
      now: 2_000,
    };
    expect(loop.plan(desired(2), observed)).toEqual([]);
    expect(loop.plan(desired(3), observed).map((a) => `${a.kind} ${a.key}`)).toEqual(['close service:main/gone']);
  });

  it('closes it after the drain period even if the router never catches up', () => {
    const observed = {
      services: new Set(['main/app', 'main/gone']),
      replicas: new Map([['r1', held]]),
      retiring: retiring(1_000),
      now: 31_000,
    };
    expect(loop.plan(desired(2), observed).map((a) => `${a.kind} ${a.key}`)).toEqual(['close service:main/gone']);
  });

  it('keeps the socket and its replicas when the service comes back while retiring', () => {
    const observed = {
      services: new Set(['main/app']),
      replicas: new Map([['r1', held]]),
      retiring: new Map([['main/app', { since: 3, at: 0, caughtUpAt: null, replicas: new Set(['r1']) }]]),
      now: 1,
    };
    expect(loop.plan(desired(2), observed).map((a) => `${a.kind} ${a.key}`)).toEqual(['restore service:main/app']);
  });
});

describe('plan with by-host routes (the gateway)', () => {
  const loop = createSshLoop({ stateDir: '/nonexistent', routedBy: 'nginx', sharedSocket: true, hostRoutes: true });

  it('retires a removed service with the hosts the document still has, once per document', () => {
    const spec = specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }] });
    spec.spec.services[0]!.domain = 'App.GW.test';
    const d = loop.desired(spec, none);
    expect(d.domains!()).toBe(loop.desired(spec, none).domains!()); // the same services list: not built again
    const [retire] = loop
      .plan(d, { services: new Set(['main/app', 'main/gone']), replicas: new Map() })
      .filter((a) => a.key === 'service:main/gone');
    expect(retire?.kind).toBe('delete');
    const claimed = (retire?.payload as { claimed?: ReadonlySet<string> }).claimed;
    expect(claimed).toBe(d.domains!());
    expect([...claimed!]).toEqual(['app.gw.test']);
  });
});

describe('host keys', () => {
  const k1 = Buffer.from('key-one');
  const k2 = Buffer.from('key-two');
  it('trusts on first use and refuses a changed key for the same path', () => {
    const book = new HostKeyBook();
    expect(book.check('a:22', k1).ok).toBe(true);
    expect(book.check('a:22', k1).ok).toBe(true);
    expect(book.check('a:22', k2).ok).toBe(false);
    expect(book.check('j:22>a:22', k2).ok).toBe(true); // another machine behind a jump host
  });
  it('checks a pinned fingerprint, with or without base64 padding', () => {
    const book = new HostKeyBook();
    const fp = sha256Fingerprint(k1);
    expect(fp).toMatch(/^SHA256:[A-Za-z0-9+/]{43}$/);
    expect(book.check('a:22', k1, fp).ok).toBe(true);
    expect(book.check('a:22', k1, `${fp}=`).ok).toBe(true);
    expect(book.check('a:22', k2, fp).ok).toBe(false);
  });
});

describe('plan skipping converged services', () => {
  const loop = createSshLoop({ stateDir: '/nonexistent' });
  const spec = specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }], other: [{ id: 'r2', appPort: 8000, ssh }] });
  const desired = loop.desired(spec, none);
  const facts = (held: number): ServiceFacts => ({ listening: true, held, readTimeout: false, hostRoute: false });

  it('compares a service again only when its entry or its facts changed', () => {
    const converged: ConvergedServices = new WeakMap();
    const held = heldAs(desired);
    const byService = new Map([
      ['main/app', facts(1)],
      ['main/other', facts(1)],
    ]);
    expect(planSsh(desired, { ...held, facts: byService }, 1000, converged)).toEqual([]);
    // r1 no longer held, but its service's facts say nothing changed: not compared again.
    const without = { ...held, replicas: new Map([...held.replicas].filter(([id]) => id !== 'r1')) };
    expect(planSsh(desired, { ...without, facts: byService }, 1000, converged)).toEqual([]);
    // New facts, as the loop makes on every change: compared, and r1 is opened again.
    byService.set('main/app', facts(0));
    expect(planSsh(desired, { ...without, facts: byService }, 1000, converged).map((a) => `${a.kind} ${a.key}`)).toEqual([
      'create replica:r1',
    ]);
    // Without facts nothing is skipped.
    expect(planSsh(desired, without, 1000, converged).map((a) => `${a.kind} ${a.key}`)).toEqual(['create replica:r1']);
  });

  it('finds what spans services by counting: a removed service, a replica that moved, a route left behind', () => {
    const converged: ConvergedServices = new WeakMap();
    const byService = new Map([
      ['main/app', facts(1)],
      ['main/other', facts(1)],
    ]);
    const held = heldAs(desired);
    expect(planSsh(desired, { ...held, facts: byService }, 1000, converged)).toEqual([]);
    // r2 moves from other to app; other leaves the document.
    const next = loop.desired(
      specOf(KEY, {
        app: [
          { id: 'r1', appPort: 8000, ssh },
          { id: 'r2', appPort: 8000, ssh },
        ],
      }),
      none,
    );
    const hosts = new Map([['main/gone', { host: 'gone.test', cors: false, auth: false }]]);
    const plan = planSsh(next, { ...held, facts: byService, hosts }, 1000, converged);
    expect(plan.map((a) => `${a.kind} ${a.key}`)).toEqual(['delete service:main/other', 'update replica:r2', 'delete host:main/gone']);
    expect(planDifference(plan, planSsh(next, { ...held, hosts }, 1000))).toBeNull();
  });

  it('a retiring service left over is found without gathering the document; one back again is restored', () => {
    const converged: ConvergedServices = new WeakMap();
    const held = heldAs(desired);
    const retiring = new Map([['main/gone', { since: 2, at: 0, caughtUpAt: null, replicas: new Set<string>() }]]);
    const observed = { ...held, services: new Set([...held.services, 'main/gone']), retiring, now: 10 };
    expect(planSsh({ ...desired, routedUpTo: 1 }, observed, 1000, converged)).toEqual([]);
    expect(planSsh({ ...desired, routedUpTo: 2 }, observed, 1000, converged).map((a) => `${a.kind} ${a.key}`)).toEqual([
      'close service:main/gone',
    ]);
    const back = loop.desired(
      specOf(KEY, { app: [{ id: 'r1', appPort: 8000, ssh }], gone: [], other: [{ id: 'r2', appPort: 8000, ssh }] }),
      none,
    );
    expect(planSsh(back, observed, 1000, converged).map((a) => `${a.kind} ${a.key}`)).toEqual(['restore service:main/gone']);
  });
});
