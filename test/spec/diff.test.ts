// diffSpecs: the exact change entries for adding, removing and changing each kind of object;
// secrets only as '<redacted>'; redact() and scrubSecrets() leak nothing.

import { describe, expect, it } from 'vitest';
import { diffSpecs, redact, REDACTED, scrubSecrets, secretsOf, type ObjectChange, type ProxyState } from '../../src/spec/index.js';
import { keyBody, TEST_KEY_A, TEST_KEY_B, TEST_KEY_C, TEST_KEY_D } from '../helpers/keys.js';
import { baseDocument, edited, EAB_HMAC, JUMP_KEY, MAIN_KEY, REMOVE, type Edit } from './fixtures.js';
import { expectValid } from './expect.js';

// In the normalised base: services sorted main/llama (0), research/mistral (1); llama's replicas r1, r2.
const S0 = '/spec/services/0';
const S1 = '/spec/services/1';
const before = expectValid(baseDocument());
const after = (...edits: Edit[]): ProxyState => expectValid(edited(baseDocument(), ...edits));

describe('diffSpecs', () => {
  it('finds nothing between equal documents', () => {
    expect(diffSpecs(before, after())).toEqual({ changes: [], added: 0, removed: 0, changed: 0 });
  });

  it.each<[string, Edit[], ObjectChange[]]>([
    [
      'acme: a changed server and a new email',
      [['/spec/acme', { server: 'https://other.example.com/dir' }]],
      [
        {
          kind: 'acme',
          key: 'acme',
          op: 'changed',
          fields: [
            { field: 'email', old: 'ops@example.com' },
            { field: 'server', old: 'https://acme.example.com/directory', new: 'https://other.example.com/dir' },
          ],
        },
      ],
    ],
    ['project added', [['/spec/projects/-', { name: 'new-project' }]], [{ kind: 'project', key: 'new-project', op: 'added' }]],
    [
      'service added (with its replicas)',
      [
        [
          '/spec/services/-',
          { project: 'research', run: 'qwen', replicas: [{ id: 'q1', appPort: 80, direct: { host: '10.1.1.1', port: 80 } }] },
        ],
      ],
      [
        { kind: 'service', key: 'research/qwen', op: 'added' },
        { kind: 'replica', key: 'research/qwen/q1', op: 'added' },
      ],
    ],
    [
      'service removed (with its replicas)',
      [['/spec/services/0', REMOVE]],
      [
        { kind: 'service', key: 'main/llama', op: 'removed' },
        { kind: 'replica', key: 'main/llama/r1', op: 'removed' },
        { kind: 'replica', key: 'main/llama/r2', op: 'removed' },
      ],
    ],
    [
      'service changed',
      [
        [`${S0}/auth`, false],
        [`${S0}/domain`, 'llama2.gw.example.com'],
        [`${S0}/model/prefix`, '/v2'],
      ],
      [
        {
          kind: 'service',
          key: 'main/llama',
          op: 'changed',
          fields: [
            { field: 'auth', old: true, new: false },
            { field: 'domain', old: 'llama.gw.example.com', new: 'llama2.gw.example.com' },
            { field: 'model.prefix', old: '/v1', new: '/v2' },
          ],
        },
      ],
    ],
    [
      'service rate limits changed (a list compares as a whole)',
      [[`${S0}/rateLimits/0/rps`, 3]],
      [
        {
          kind: 'service',
          key: 'main/llama',
          op: 'changed',
          fields: [
            {
              field: 'rateLimits',
              old: [{ prefix: '/v1/chat', key: { type: 'ipAddress' }, rps: 2.5, burst: 5 }],
              new: [{ prefix: '/v1/chat', key: { type: 'ipAddress' }, rps: 3, burst: 5 }],
            },
          ],
        },
      ],
    ],
    [
      'replica added',
      [[`${S1}/replicas/-`, { id: 'r4', appPort: 81, direct: { host: '10.0.0.9', port: 81 } }]],
      [{ kind: 'replica', key: 'research/mistral/r4', op: 'added' }],
    ],
    ['replica removed', [[`${S0}/replicas/1`, REMOVE]], [{ kind: 'replica', key: 'main/llama/r2', op: 'removed' }]],
    [
      'replica changed',
      [
        [`${S0}/replicas/0/ssh/port`, 2222],
        [`${S0}/replicas/0/appPort`, 8001],
      ],
      [
        {
          kind: 'replica',
          key: 'main/llama/r1',
          op: 'changed',
          fields: [
            { field: 'appPort', old: 8000, new: 8001 },
            { field: 'ssh.port', old: 22, new: 2222 },
          ],
        },
      ],
    ],
    [
      'replica switched from direct to ssh',
      [[`${S0}/replicas/1`, { id: 'r2', appPort: 8000, ssh: { host: 'h.example.net', user: 'root' } }]],
      [
        {
          kind: 'replica',
          key: 'main/llama/r2',
          op: 'changed',
          fields: [
            { field: 'direct', old: { host: '10.0.0.5', port: 8000 } },
            { field: 'ssh', new: { host: 'h.example.net', port: 22, user: 'root' } },
          ],
        },
      ],
    ],
    [
      'replica moved between services',
      [
        [`${S0}/replicas/1`, REMOVE],
        [`${S1}/replicas/-`, { id: 'r2', appPort: 8000, direct: { host: '10.0.0.5', port: 8000 } }],
      ],
      [
        { kind: 'replica', key: 'main/llama/r2', op: 'removed' },
        { kind: 'replica', key: 'research/mistral/r2', op: 'added' },
      ],
    ],
    [
      'entrypoint added',
      [['/spec/entrypoints/-', { project: 'research', domain: 'research.gw.example.com' }]],
      [{ kind: 'entrypoint', key: 'research.gw.example.com', op: 'added' }],
    ],
    ['entrypoint removed', [['/spec/entrypoints/0', REMOVE]], [{ kind: 'entrypoint', key: 'gateway.gw.example.com', op: 'removed' }]],
    [
      'entrypoint changed',
      [
        ['/spec/entrypoints/0/https', false],
        ['/spec/entrypoints/0/project', 'research'],
      ],
      [
        {
          kind: 'entrypoint',
          key: 'gateway.gw.example.com',
          op: 'changed',
          fields: [
            { field: 'https', old: true, new: false },
            { field: 'project', old: 'main', new: 'research' },
          ],
        },
      ],
    ],
  ])('%s', (_name, edits, changes) => {
    const diff = diffSpecs(before, after(...edits));
    expect(diff.changes).toEqual(changes);
    expect(diff.added).toBe(changes.filter((c) => c.op === 'added').length);
    expect(diff.removed).toBe(changes.filter((c) => c.op === 'removed').length);
    expect(diff.changed).toBe(changes.filter((c) => c.op === 'changed').length);
  });

  it('project removed', () => {
    // (Not in the table: the base document has no project that can go without its services.)
    const withSpare = after(['/spec/projects/-', { name: 'spare', sshPrivateKey: MAIN_KEY }]);
    expect(diffSpecs(withSpare, before).changes).toEqual([{ kind: 'project', key: 'spare', op: 'removed' }]);
  });

  it('project changed: a new private key shows only as <redacted> with secret: true', () => {
    const diff = diffSpecs(before, after(['/spec/projects/0/sshPrivateKey', JUMP_KEY]));
    expect(diff.changes).toEqual([
      { kind: 'project', key: 'main', op: 'changed', fields: [{ field: 'sshPrivateKey', old: REDACTED, new: REDACTED, secret: true }] },
    ]);
  });

  it('project gains a key: only the new side, redacted', () => {
    const diff = diffSpecs(before, after(['/spec/projects/1/sshPrivateKey', JUMP_KEY]));
    expect(diff.changes).toEqual([
      { kind: 'project', key: 'research', op: 'changed', fields: [{ field: 'sshPrivateKey', new: REDACTED, secret: true }] },
    ]);
  });

  it('acme: a changed EAB key shows only as <redacted> with secret: true', () => {
    const eab = (key: string): Edit => [
      '/spec/acme',
      { server: 'https://acme.example.com/dir', email: 'ops@example.com', eabKid: 'kid-1', eabHmacKey: key },
    ];
    const diff = diffSpecs(after(eab(EAB_HMAC)), after(eab(`${EAB_HMAC}Zm9v`)));
    expect(diff.changes).toEqual([
      { kind: 'acme', key: 'acme', op: 'changed', fields: [{ field: 'eabHmacKey', old: REDACTED, new: REDACTED, secret: true }] },
    ]);
  });

  it('replica: a changed jump-host key is redacted, an added jump host has its key redacted', () => {
    const jump = (privateKey: string): Edit => [`${S0}/replicas/0/sshProxy`, { host: 'jump.example.net', user: 'root', privateKey }];
    const changedKey = diffSpecs(after(jump(JUMP_KEY)), after(jump(MAIN_KEY)));
    expect(changedKey.changes).toEqual([
      {
        kind: 'replica',
        key: 'main/llama/r1',
        op: 'changed',
        fields: [{ field: 'sshProxy.privateKey', old: REDACTED, new: REDACTED, secret: true }],
      },
    ]);
    const added = diffSpecs(before, after(jump(JUMP_KEY)));
    expect(added.changes).toEqual([
      {
        kind: 'replica',
        key: 'main/llama/r1',
        op: 'changed',
        fields: [{ field: 'sshProxy', new: { host: 'jump.example.net', port: 22, user: 'root', privateKey: REDACTED } }],
      },
    ]);
  });
});

describe('secrets never leave', () => {
  // Real keys (validation parses them), rotated between the two documents so every one changes.
  const KEYS = [TEST_KEY_A, TEST_KEY_B, TEST_KEY_C, TEST_KEY_D];
  const secretEdits = (variant: 'A' | 'B'): Edit[] => {
    const k = variant === 'A' ? KEYS : [...KEYS.slice(1), KEYS[0]!];
    return [
      ['/spec/acme', { server: 'https://acme.example.com/dir', eabKid: 'kid-1', eabHmacKey: `${EAB_HMAC}${variant}` }],
      ['/spec/projects/0/sshPrivateKey', k[0]!],
      ['/spec/projects/1/sshPrivateKey', k[1]!],
      [`${S0}/replicas/0/sshProxy`, { host: 'jump.example.net', user: 'root', privateKey: k[2]! }],
      [`${S0}/replicas/0/sshHeadProxy`, { host: 'head.example.net', user: 'root', privateKey: k[3]! }],
    ];
  };
  const a = after(...secretEdits('A'));
  const b = after(...secretEdits('B'));
  const secrets = [...secretsOf(a), ...secretsOf(b)];

  it('finds every secret of the document', () => {
    expect(secretsOf(a)).toHaveLength(5);
  });

  it.each([
    ['a diff where every secret changed', () => diffSpecs(a, b)],
    ['a diff where every secret was added', () => diffSpecs(before, b)],
    ['a diff where every secret was removed', () => diffSpecs(a, before)],
    ['a diff from the empty document', () => diffSpecs(expectValid({ apiVersion: a.apiVersion, kind: a.kind, spec: {} }), a)],
    ['redact(state)', () => redact(a)],
  ])('no secret string appears in %s', (_name, make) => {
    const text = JSON.stringify(make());
    for (const s of secrets) expect(text).not.toContain(s);
    for (const fragment of [...KEYS.flatMap(keyBody), EAB_HMAC]) {
      expect(text).not.toContain(fragment);
    }
  });

  it('redact() keeps every other field and marks each secret', () => {
    const r = redact(a);
    expect(r.spec.acme).toEqual({ ...a.spec.acme, eabHmacKey: REDACTED });
    expect(r.spec.projects.map((p) => p.sshPrivateKey)).toEqual([REDACTED, REDACTED]);
    const replica = r.spec.services[0]!.replicas[0]!;
    expect(replica.sshProxy).toEqual({ ...a.spec.services[0]!.replicas[0]!.sshProxy, privateKey: REDACTED });
    expect(replica.sshHeadProxy?.privateKey).toBe(REDACTED);
    expect(JSON.stringify(redact(before)).includes(MAIN_KEY)).toBe(false);
    expect(a.spec.projects[0]!.sshPrivateKey).toBe(TEST_KEY_A); // the input is untouched
  });

  it('scrubSecrets() replaces secrets in free text', () => {
    const text = `ssh failed with key ${TEST_KEY_C} and hmac ${EAB_HMAC}A`;
    const scrubbed = scrubSecrets(text, a);
    for (const s of secretsOf(a)) expect(scrubbed).not.toContain(s);
    expect(scrubbed).toBe(`ssh failed with key ${REDACTED} and hmac ${REDACTED}`);
  });
});
