// The host-key book: `tofu` per path for the process's lifetime; `tofu-per-replica` per replica
// id at the destination, shared by the replicas reaching a jump host; pins win; retain() forgets
// the replicas that left. And the policy as the SSH targets carry it.

import { describe, expect, it } from 'vitest';
import { HostKeyBook, sha256Fingerprint, type HostKeyScope } from '../../../src/reconcilers/ssh/host-keys.js';
import { desiredFromSpec, type DesiredReplica } from '../../../src/reconcilers/ssh/targets.js';
import { emptyState, type HostKeyPolicy, type ProxyState } from '../../../src/spec/types.js';

const k1 = Buffer.from('key-one');
const k2 = Buffer.from('key-two');
const k3 = Buffer.from('key-three');
const dest = (endpoint: string): { endpoint: string; destination: boolean } => ({ endpoint, destination: true });
const jump = (endpoint: string): { endpoint: string; destination: boolean } => ({ endpoint, destination: false });
const per = (replicaId: string): HostKeyScope => ({ policy: 'tofu-per-replica', replicaId });
const tofu = (replicaId: string): HostKeyScope => ({ policy: 'tofu', replicaId });

describe('host-key book, tofu', () => {
  it('trusts the first key of a path whichever replica reaches it, and refuses a change', () => {
    const book = new HostKeyBook();
    expect(book.check(dest('a:22'), k1, undefined, tofu('r1')).ok).toBe(true);
    const v = book.check(dest('a:22'), k2, undefined, tofu('r2'));
    expect(v.ok).toBe(false);
    expect(!v.ok && v.message).toBe(
      `host key of a:22 changed from ${sha256Fingerprint(k1)} to ${sha256Fingerprint(k2)}; refusing to connect`,
    );
    // No scope at all is tofu too.
    expect(book.check('a:22', k2).ok).toBe(false);
    expect(book.check('a:22', k1).ok).toBe(true);
  });

  it('keeps its entries when replicas leave: the lifetime of the process', () => {
    const book = new HostKeyBook();
    book.check(dest('a:22'), k1, undefined, tofu('r1'));
    book.retain(new Set());
    expect(book.check(dest('a:22'), k2, undefined, tofu('r2')).ok).toBe(false);
    expect(book.size).toEqual({ tofu: 1, perReplica: 0, shared: 0 });
  });
});

describe('host-key book, tofu-per-replica', () => {
  it('lets a new replica id present a new key at a known destination; a change under one id is refused', () => {
    const book = new HostKeyBook();
    expect(book.check(dest('vm:22>localhost:10022'), k1, undefined, per('r1')).ok).toBe(true);
    expect(book.check(dest('vm:22>localhost:10022'), k2, undefined, per('r2')).ok).toBe(true);
    const v = book.check(dest('vm:22>localhost:10022'), k2, undefined, per('r1'));
    expect(v.ok).toBe(false);
    expect(!v.ok && v.message).toMatch(/^host key of vm:22>localhost:10022 changed from SHA256:\S+ to SHA256:\S+ for replica r1; refusing/);
    expect(book.check(dest('vm:22>localhost:10022'), k1, undefined, per('r1')).ok).toBe(true);
    expect(book.get('vm:22>localhost:10022', per('r2'))).toBe(sha256Fingerprint(k2));
  });

  it('shares a jump host key among the replicas behind it until the last that trusted it leaves', () => {
    const book = new HostKeyBook();
    expect(book.check(jump('vm:22'), k1, undefined, per('r1')).ok).toBe(true);
    expect(book.check(jump('vm:22'), k1, undefined, per('r2')).ok).toBe(true);
    // A changed jump host key is refused for a new replica too while r1 or r2 is in the document.
    const v = book.check(jump('vm:22'), k2, undefined, per('r3'));
    expect(v.ok).toBe(false);
    expect(!v.ok && v.message).toMatch(/changed from .* while replicas that trusted it are in the document; refusing/);
    book.retain(new Set(['r2', 'r3']));
    expect(book.check(jump('vm:22'), k2, undefined, per('r3')).ok).toBe(false);
    book.retain(new Set(['r3']));
    expect(book.size.shared).toBe(0);
    // The machine behind the reused address was replaced after its replicas were gone.
    expect(book.check(jump('vm:22'), k2, undefined, per('r3')).ok).toBe(true);
    expect(book.get('vm:22', per('r3'), false)).toBe(sha256Fingerprint(k2));
  });

  it('forgets a replica that left: the same id again trusts afresh, and nothing grows', () => {
    const book = new HostKeyBook();
    for (let i = 0; i < 100; i++) {
      book.check(jump('vm:22'), k1, undefined, per(`r${i}`));
      book.check(dest('vm:22>localhost:10022'), Buffer.from(`k${i}`), undefined, per(`r${i}`));
    }
    expect(book.size).toEqual({ tofu: 0, perReplica: 100, shared: 1 });
    book.retain(new Set(['r99']));
    expect(book.size).toEqual({ tofu: 0, perReplica: 1, shared: 1 });
    book.retain(new Set());
    expect(book.size).toEqual({ tofu: 0, perReplica: 0, shared: 0 });
    expect(book.check(dest('vm:22>localhost:10022'), k3, undefined, per('r1')).ok).toBe(true);
  });

  it('keeps its book apart from tofu: neither policy judges the other', () => {
    const book = new HostKeyBook();
    book.check(dest('a:22'), k1, undefined, tofu('t1'));
    expect(book.check(dest('a:22'), k2, undefined, per('r1')).ok).toBe(true);
    expect(book.check(dest('a:22'), k2, undefined, tofu('t2')).ok).toBe(false);
  });

  it('lets a pinned fingerprint win over either policy', () => {
    const book = new HostKeyBook();
    const fp1 = sha256Fingerprint(k1);
    book.check(dest('a:22'), k2, undefined, per('r1'));
    // Pinned and right: accepted even though r1 first saw another key (and nothing is recorded).
    expect(book.check(dest('a:22'), k1, fp1, per('r1')).ok).toBe(true);
    expect(book.get('a:22', per('r1'))).toBe(sha256Fingerprint(k2));
    // Pinned and wrong: refused even for a new replica that per-replica trust would accept.
    const v = book.check(dest('a:22'), k3, fp1, per('r9'));
    expect(!v.ok && v.message).toBe(`host key of a:22 is ${sha256Fingerprint(k3)}, the document pins ${fp1}`);
    expect(book.check(jump('j:22'), k3, fp1, per('r9')).ok).toBe(false);
  });
});

describe('the policy in the SSH targets', () => {
  const stateWith = (policy: HostKeyPolicy | undefined): ProxyState => {
    const state = emptyState();
    state.spec.projects = [{ name: 'main', sshPrivateKey: 'not-a-key' }];
    state.spec.services = [
      {
        project: 'main',
        run: 'app',
        https: false,
        auth: false,
        clientMaxBodySize: 1024,
        stripPrefix: true,
        rateLimits: [],
        replicas: [{ id: 'r1', appPort: 80, ...(policy ? { hostKeyPolicy: policy } : {}), ssh: { host: 'h', port: 22, user: 'u' } }],
      },
    ];
    return state;
  };
  const target = (policy: HostKeyPolicy | undefined): DesiredReplica => desiredFromSpec(stateWith(policy)).replicas.get('r1')!;

  it('carries tofu-per-replica, leaves tofu out (as absent), and a changed policy changes the fingerprint', () => {
    expect(target('tofu-per-replica').target).toMatchObject({ kind: 'ssh', hostKeyPolicy: 'tofu-per-replica' });
    expect(target('tofu').target).not.toHaveProperty('hostKeyPolicy');
    expect(target('tofu').fingerprint).toBe(target(undefined).fingerprint);
    expect(target('tofu-per-replica').fingerprint).not.toBe(target(undefined).fingerprint);
  });
});
