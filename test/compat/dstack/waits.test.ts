// What dstack's registrations wait for, against real components: replicas/register answers 200
// once the tunnel through a loopback sshd is Ready, and 400 (the replica removed again) when
// it cannot be, within the bounded wait; an https registration waits for its certificate from
// Pebble, answers 400 with dstack's DNS text when the domain does not resolve (undone), and in
// async mode answers at once and serves HTTP. Bounds are generous; nothing asserts speed.

import { FakeClock } from '../../helpers/fake-clock.js';
import type { Server } from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestGateway } from '../../helpers/gateway.js';
import { close, startEcho } from '../../helpers/http.js';
import { eventually } from '../../helpers/nginx.js';
import { startPebble, type TestPebble } from '../../helpers/pebble.js';
import { freePort } from '../../helpers/ports.js';
import { startSshd, type TestSshd } from '../../helpers/sshd.js';
import { tmpDir } from '../../helpers/tmp.js';
import { certificateCheck, passCheck, replicaCheck, waitForStatus, type StatusSource } from '../../../src/compat/dstack/waits.js';
import type { LoopStatus, StatusSnapshot } from '../../../src/reconcilers/types.js';
import { call } from '../../e2e/integration-harness.js';
import { dstack, listed, startCompatGateway } from './harness.js';
import {
  dstackId,
  dstackPaths,
  dstackProjectKey,
  entrypointPayload,
  pebbleConfigPayload,
  registerServicePayload,
  vmReplicaPayload,
  type DstackKey,
} from './fixtures.js';

let tmp: ReturnType<typeof tmpDir>;
let key: DstackKey;
let sshd: TestSshd;
let app: Server;
let appPort: number;

beforeAll(async () => {
  tmp = tmpDir('dp-compat-waits-');
  key = dstackProjectKey();
  sshd = await startSshd({ dir: join(tmp.dir, 'sshd'), authorizedKeys: [key.publicKey] });
  appPort = await freePort();
  app = await startEcho('waited', { port: appPort });
}, 60_000);

afterAll(async () => {
  await sshd?.stop();
  if (app) await close(app);
  tmp?.cleanup();
});

const detailOf = (json: unknown): string => (json as { detail: string }).detail;

/** A loop status with one object whose Ready condition is given. */
function loopWith(
  key: string,
  ready: { status: 'True' | 'False'; reason: string; message?: string; observedGeneration: number },
  outputs?: Record<string, string | number | null>,
): LoopStatus {
  const condition = { type: 'Ready', message: '', lastTransitionTime: new Date(0), ...ready };
  return {
    conditions: [],
    objects: { [key]: { conditions: [condition], ...(outputs ? { outputs } : {}) } },
    failures: {},
  } as unknown as LoopStatus;
}

describe('the checks (pure)', () => {
  const check = replicaCheck('main/svc', 'r1', 5);
  it('a replica: Ready only at the generation written or later; definitive reasons at once; retried ones keep waiting', () => {
    expect(
      check({ loops: { ssh: loopWith('main/svc/r1', { status: 'True', reason: 'Connected', observedGeneration: 4 }) } }),
    ).toBeUndefined();
    expect(check({ loops: { ssh: loopWith('main/svc/r1', { status: 'True', reason: 'Connected', observedGeneration: 5 }) } })).toEqual({
      kind: 'ready',
    });
    expect(
      check({
        loops: {
          ssh: loopWith('main/svc/r1', {
            status: 'False',
            reason: 'ConnectFailed',
            message: 'refused; retrying in 1.2 s',
            observedGeneration: 6,
          }),
        },
      }),
    ).toBeUndefined();
    expect(
      check({
        loops: {
          ssh: loopWith('main/svc/r1', { status: 'False', reason: 'AuthFailed', message: 'authentication failed', observedGeneration: 5 }),
        },
      }),
    ).toEqual({
      kind: 'failed',
      reason: 'AuthFailed: authentication failed',
    });
    expect(check({ loops: { tls: loopWith('main/svc/r1', { status: 'True', reason: 'Issued', observedGeneration: 9 }) } })).toBeUndefined();
  });

  it('a certificate: served at once; a failure only from a pass at the generation written or later', () => {
    const cert = certificateCheck('a.example.test', 3);
    expect(cert({ loops: { tls: loopWith('a.example.test', { status: 'True', reason: 'Issued', observedGeneration: 1 }) } })).toEqual({
      kind: 'ready',
    });
    expect(
      cert({ loops: { tls: loopWith('a.example.test', { status: 'False', reason: 'DNSNotReady', observedGeneration: 2 }) } }),
    ).toBeUndefined();
    expect(
      cert({
        loops: {
          // The error is read from the loop's typed output, not parsed out of the message.
          tls: loopWith(
            'a.example.test',
            { status: 'False', reason: 'IssueFailed', message: 'failedAttempts 1; error something else', observedGeneration: 3 },
            { failedAttempts: 1, lastError: 'urn:acme:error:rejected\nbad' },
          ),
        },
      }),
    ).toEqual({ kind: 'failed', failure: { kind: 'issue', error: 'urn:acme:error:rejected bad' } });
    expect(
      cert({ loops: { tls: loopWith('a.example.test', { status: 'False', reason: 'Pending', observedGeneration: 3 }) } }),
    ).toBeUndefined();
  });

  it("passCheck: the loop's own Ready at the generation or later, whatever its status", () => {
    const loop = (observedGeneration: number, status: 'True' | 'False'): LoopStatus =>
      ({
        conditions: [{ type: 'Ready', status, reason: 'x', message: '', lastTransitionTime: new Date(0), observedGeneration }],
        objects: {},
        failures: {},
      }) as unknown as LoopStatus;
    const at7 = passCheck('ssh', 7);
    expect(at7({ loops: {} })).toBeUndefined();
    expect(at7({ loops: { ssh: loop(6, 'True') } })).toBeUndefined();
    expect(at7({ loops: { tls: loop(9, 'True') } })).toBeUndefined();
    expect(at7({ loops: { ssh: loop(7, 'False') } })).toEqual({ kind: 'ready' });
    expect(at7({ loops: { ssh: loop(8, 'True') } })).toEqual({ kind: 'ready' });
  });

  it('waitForStatus: a verdict from a change, the timeout verdict, or closed', async () => {
    let listener: ((loop: string, status: LoopStatus) => void) | undefined;
    const empty: StatusSnapshot = { generation: 5, observedGeneration: 5, loops: {} };
    const source: StatusSource = { statuses: () => empty, onStatus: (l) => ((listener = l), () => (listener = undefined)) };
    const never = new AbortController().signal;
    const clock = new FakeClock();
    const bound = { onTimeout: () => ({ kind: 'failed', reason: 'late' }) as const, signal: never, clock };
    const ready = waitForStatus(source, check, { timeoutMs: 60_000, ...bound });
    listener?.('ssh', loopWith('main/svc/r1', { status: 'True', reason: 'Connected', observedGeneration: 5 }));
    expect(await ready).toEqual({ kind: 'ready' });
    expect(listener).toBeUndefined();
    expect(clock.pendingTimers()).toBe(0); // a verdict clears its bound
    let late: unknown;
    const timing = waitForStatus(source, check, { timeoutMs: 10_000, ...bound }).then((r) => (late = r));
    clock.advance(9_999);
    await Promise.resolve();
    expect(late).toBeUndefined();
    clock.advance(1);
    await timing;
    expect(late).toEqual({ kind: 'failed', reason: 'late' });
    const ac = new AbortController();
    const closing = waitForStatus(source, check, { timeoutMs: 60_000, ...bound, signal: ac.signal });
    ac.abort();
    expect(await closing).toEqual({ kind: 'closed' });
  });
});

describe('replicas/register waits for the tunnel (3 s bound)', () => {
  let t: TestGateway;
  beforeAll(async () => {
    t = await startCompatGateway({ flags: { dstackCompatReplicaWait: '3' }, deps: { ssh: { reconnect: { baseMs: 200, maxMs: 1_000 } } } });
    const r = await dstack(
      t,
      dstackPaths.registerService('main'),
      registerServicePayload({ runName: 'svc', auth: false, model: null, sshPrivateKey: key.privateKey }),
    );
    expect(r.status).toBe(200);
  }, 60_000);
  afterAll(async () => t?.cleanup());

  const inDocument = async (id: string): Promise<boolean> =>
    (await t.gw.store.read()).state.spec.services.some((s) => s.replicas.some((r) => r.id === id));

  it('a reachable replica: 200, listed, Ready', async () => {
    const id = dstackId();
    const r = await dstack(
      t,
      dstackPaths.registerReplica('main', 'svc'),
      vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: sshd.port }),
    );
    expect(r.status).toBe(200);
    expect((await listed(t))[0]?.replicas).toEqual([{ id }]);
    expect(t.gw.controller.statuses().loops.ssh?.objects[`main/svc/${id}`]?.conditions.find((c) => c.type === 'Ready')?.status).toBe(
      'True',
    );
    expect((await dstack(t, dstackPaths.unregisterReplica('main', 'svc', id))).status).toBe(200);
  });

  it('the app port is closed: 400 with the reason, the replica removed again', async () => {
    const id = dstackId();
    const closedPort = await freePort();
    const r = await dstack(
      t,
      dstackPaths.registerReplica('main', 'svc'),
      vmReplicaPayload({ jobId: id, appPort: closedPort, user: sshd.user, sshPort: sshd.port }),
    );
    expect(r.status).toBe(400);
    expect(detailOf(r.json)).toMatch(new RegExp(`^Cannot register replica ${id} in service main/svc: \\S`));
    expect((await listed(t))[0]?.replicas).toEqual([]);
    expect(await inDocument(id)).toBe(false);
  });

  it('nothing listens on the SSH port: 400 once the bound passes, removed again', async () => {
    const id = dstackId();
    const noSsh = await freePort();
    const r = await dstack(
      t,
      dstackPaths.registerReplica('main', 'svc'),
      vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: noSsh }),
    );
    expect(r.status).toBe(400);
    expect(detailOf(r.json)).toMatch(new RegExp(`^Cannot register replica ${id} in service main/svc: .*not ready within 3 s`));
    expect(await inDocument(id)).toBe(false);
  });

  it('sshd refuses the key: 400 with AuthFailed, removed again', async () => {
    const other = await startSshd({ dir: join(tmp.dir, 'sshd-other'), authorizedKeys: [dstackProjectKey('someone-else').publicKey] });
    try {
      const id = dstackId();
      const r = await dstack(
        t,
        dstackPaths.registerReplica('main', 'svc'),
        vmReplicaPayload({ jobId: id, appPort, user: other.user, sshPort: other.port }),
      );
      expect(r.status).toBe(400);
      expect(detailOf(r.json)).toMatch(new RegExp(`^Cannot register replica ${id} in service main/svc: AuthFailed`));
      expect(await inDocument(id)).toBe(false);
    } finally {
      await other.stop();
    }
  });
});

describe('a wait when the daemon closes', () => {
  it('holds no lock, ends at once with 503 (not a refusal), and the replica stays registered', async () => {
    const t = await startCompatGateway({ flags: { dstackCompatReplicaWait: '600' } });
    try {
      expect(
        (
          await dstack(
            t,
            dstackPaths.registerService('main'),
            registerServicePayload({ runName: 'svc', model: null, sshPrivateKey: key.privateKey }),
          )
        ).status,
      ).toBe(200);
      const id = dstackId();
      const pending = dstack(
        t,
        dstackPaths.registerReplica('main', 'svc'),
        vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: await freePort() }),
      );
      await eventually(async () => ((await t.gw.store.read()).state.spec.services[0]?.replicas.length === 1 ? true : undefined), 20_000);
      // The wait holds no lock: another call is answered meanwhile.
      let settled = false;
      void pending.then(() => (settled = true));
      const other = await dstack(
        t,
        dstackPaths.registerService('main'),
        registerServicePayload({ runName: 'meanwhile', model: null, sshPrivateKey: key.privateKey }),
      );
      expect(other.status).toBe(200);
      expect(settled).toBe(false);
      await t.close();
      const r = await pending;
      expect(r.status).toBe(503);
      expect(detailOf(r.json)).toBe('The gateway is shutting down');
      expect(readFileSync(join(t.stateDir, 'state.json'), 'utf8')).toContain(id);
    } finally {
      await t.cleanup();
    }
  }, 60_000);
});

/** Test domains are not in DNS: everything resolves to loopback except names under `nodns.`. */
const resolve = async (domain: string): Promise<string[]> => {
  if (domain.includes('nodns.')) throw Object.assign(new Error(`queryA ENOTFOUND ${domain}`), { code: 'ENOTFOUND' });
  return ['127.0.0.1'];
};

describe('https registrations against Pebble', () => {
  let pebble: TestPebble;
  beforeAll(async () => {
    pebble = await startPebble();
  }, 60_000);
  afterAll(async () => pebble?.destroy());

  describe('--dstack-compat-tls wait', () => {
    let t: TestGateway;
    beforeAll(async () => {
      t = await startCompatGateway({ flags: { acmeCaBundle: pebble.caPath, certbotTimeout: '60' }, deps: { resolve } });
      expect((await dstack(t, dstackPaths.config, pebbleConfigPayload(pebble.directoryUrl))).status).toBe(200);
    }, 60_000);
    afterAll(async () => t?.cleanup());

    it('a domain that does not resolve: 400 with the DNS text, the registration undone', async () => {
      const domain = 'svc.nodns.example.test';
      const r = await dstack(
        t,
        dstackPaths.registerService('main'),
        registerServicePayload({ runName: 'nodns', domain, https: true, model: null, sshPrivateKey: key.privateKey }),
      );
      expect(r.status).toBe(400);
      expect(detailOf(r.json)).toMatch(
        /^Could not obtain svc\.nodns\.example\.test TLS certificate in \d+s\. Make sure DNS records are configured for this gateway\./,
      );
      expect(detailOf(r.json)).toContain('does not resolve');
      expect(await listed(t)).toEqual([]);
    }, 120_000);

    it('the same for an https entrypoint', async () => {
      const r = await dstack(
        t,
        dstackPaths.registerEntrypoint('main'),
        entrypointPayload({ domain: 'gateway.nodns.example.test', https: true }),
      );
      expect(r.status).toBe(400);
      expect(detailOf(r.json)).toMatch(/^Could not obtain gateway\.nodns\.example\.test TLS certificate/);
      expect((await t.gw.store.read()).state.spec.entrypoints).toEqual([]);
    }, 120_000);

    it('a domain that resolves: 200 once the certificate is issued, and HTTPS serves it', async () => {
      const domain = 'secure.main.example.test';
      const r = await dstack(
        t,
        dstackPaths.registerService('main'),
        registerServicePayload({ runName: 'secure', domain, https: true, auth: false, model: null, sshPrivateKey: key.privateKey }),
      );
      expect(r.status).toBe(200);
      const ready = t.gw.controller.statuses().loops.tls?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
      expect(ready?.status).toBe('True');
      expect((await listed(t)).map((s) => s.run_name)).toEqual(['secure']);
      const id = dstackId();
      expect(
        (
          await dstack(
            t,
            dstackPaths.registerReplica('main', 'secure'),
            vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: sshd.port }),
          )
        ).status,
      ).toBe(200);
      const root = await pebble.rootPem();
      const reply = await eventually(async () => {
        const x = await call({ port: t.httpsPort, host: domain, path: '/', ca: root }).catch(() => undefined);
        return x?.status === 200 ? x : undefined;
      }, 30_000);
      expect((JSON.parse(reply.body) as { name: string }).name).toBe('waited');
    }, 120_000);
  });

  describe('--dstack-compat-tls async', () => {
    let t: TestGateway;
    beforeAll(async () => {
      t = await startCompatGateway({
        flags: { acmeCaBundle: pebble.caPath, certbotTimeout: '60', dstackCompatTls: 'async' },
        deps: { resolve },
      });
      expect((await dstack(t, dstackPaths.config, pebbleConfigPayload(pebble.directoryUrl))).status).toBe(200);
    }, 60_000);
    afterAll(async () => t?.cleanup());

    it('a domain that does not resolve: 200 at once, served over HTTP, kept', async () => {
      const domain = 'later.nodns.example.test';
      const r = await dstack(
        t,
        dstackPaths.registerService('main'),
        registerServicePayload({ runName: 'later', domain, https: true, auth: false, model: null, sshPrivateKey: key.privateKey }),
      );
      expect(r.status).toBe(200);
      const id = dstackId();
      expect(
        (
          await dstack(
            t,
            dstackPaths.registerReplica('main', 'later'),
            vmReplicaPayload({ jobId: id, appPort, user: sshd.user, sshPort: sshd.port }),
          )
        ).status,
      ).toBe(200);
      const reply = await eventually(async () => {
        const x = await call({ port: t.httpPort, host: domain, path: '/' }).catch(() => undefined);
        return x?.status === 200 ? x : undefined;
      }, 30_000);
      expect((JSON.parse(reply.body) as { name: string }).name).toBe('waited');
      expect((await listed(t)).map((s) => s.run_name)).toEqual(['later']);
    }, 120_000);
  });
});
