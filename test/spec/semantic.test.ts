// Every rule in src/spec/semantic.ts: a document that follows it and documents that break it,
// each with the exact JSON-pointer path and a message that names the problem.

import { TEST_KEY_C } from '../helpers/keys.js';
import { describe, expect, it } from 'vitest';
import { MAX_SERVICES, validate } from '../../src/spec/index.js';
import { baseDocument, edited, REMOVE } from './fixtures.js';
import { checkRule, expectValid, type Rule } from './expect.js';

const S0 = '/spec/services/0';
const S1 = '/spec/services/1';
const svc = (project: string, run: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  project,
  run,
  ...extra,
});

const rules: Rule[] = [
  {
    rule: 'a (project, run) pair names one service',
    valid: [['/spec/services/-', svc('research', 'llama')]],
    invalid: [
      {
        when: 'the same pair twice',
        edits: [['/spec/services/-', svc('main', 'llama')]],
        errors: [['/spec/services/2/run', /duplicates service "main\/llama" of \/spec\/services\/0/]],
      },
      {
        when: 'the same pair in another case',
        edits: [['/spec/services/-', svc('MAIN', 'Llama')]],
        errors: [['/spec/services/2/run', /duplicates service "main\/llama"/]],
      },
    ],
  },
  {
    rule: 'a domain belongs to one service or entrypoint',
    valid: [['/spec/entrypoints/-', { project: 'research', domain: 'research.gw.example.com' }]],
    invalid: [
      {
        when: 'two services with one domain',
        edits: [[`${S1}/domain`, 'llama.gw.example.com']],
        errors: [[`${S1}/domain`, /duplicates domain "llama\.gw\.example\.com" of \/spec\/services\/0\/domain/]],
      },
      {
        when: 'an entrypoint with a service domain',
        edits: [['/spec/entrypoints/0/domain', 'mistral.gw.example.com']],
        errors: [['/spec/entrypoints/0/domain', /duplicates domain "mistral\.gw\.example\.com" of \/spec\/services\/1\/domain/]],
      },
      {
        when: 'two entrypoints with one domain',
        edits: [['/spec/entrypoints/-', { project: 'research', domain: 'gateway.gw.example.com' }]],
        errors: [['/spec/entrypoints/1/domain', /duplicates domain "gateway\.gw\.example\.com" of \/spec\/entrypoints\/0\/domain/]],
      },
      {
        when: 'the same domain in another case',
        edits: [[`${S1}/domain`, 'LLAMA.gw.example.COM']],
        errors: [[`${S1}/domain`, /duplicates domain "llama\.gw\.example\.com"/]],
      },
    ],
  },
  {
    rule: 'a replica id is unique across the document',
    valid: [[`${S1}/replicas/-`, { id: 'r4', appPort: 80, direct: { host: '10.0.0.7', port: 80 } }]],
    invalid: [
      {
        when: 'the same id in two services',
        edits: [[`${S1}/replicas/0/id`, 'r1']],
        errors: [[`${S1}/replicas/0/id`, /duplicates replica id "r1" of \/spec\/services\/0\/replicas\/0; replica ids are unique/]],
      },
      {
        when: 'the same id twice in one service',
        edits: [[`${S0}/replicas/1/id`, 'r1']],
        errors: [[`${S0}/replicas/1/id`, /duplicates replica id "r1" of \/spec\/services\/0\/replicas\/0/]],
      },
    ],
  },
  {
    rule: 'project names are unique',
    valid: [['/spec/projects/-', { name: 'other' }]],
    invalid: [
      {
        when: 'the same name twice',
        edits: [['/spec/projects/-', { name: 'main' }]],
        errors: [['/spec/projects/2/name', /duplicates project "main" of \/spec\/projects\/0/]],
      },
      {
        when: 'the same name in another case',
        edits: [['/spec/projects/-', { name: 'Research' }]],
        errors: [['/spec/projects/2/name', /duplicates project "research" of \/spec\/projects\/1/]],
      },
    ],
  },
  {
    rule: 'a service names a project of the document',
    valid: [[`${S1}/project`, 'RESEARCH']],
    invalid: [
      {
        when: 'a service of an unknown project',
        edits: [[`${S1}/project`, 'ghost']],
        errors: [[`${S1}/project`, /names project "ghost", which is not in \/spec\/projects/]],
      },
      {
        when: 'a service whose project was removed',
        edits: [['/spec/projects/1', REMOVE]],
        errors: [[`${S1}/project`, /names project "research", which is not in \/spec\/projects/]],
      },
    ],
  },
  {
    rule: 'an entrypoint names a project of the document',
    valid: [['/spec/entrypoints/0/project', 'research']],
    invalid: [
      {
        when: 'an entrypoint of an unknown project',
        edits: [['/spec/entrypoints/0/project', 'ghost']],
        errors: [['/spec/entrypoints/0/project', /names project "ghost", which is not in \/spec\/projects/]],
      },
    ],
  },
  {
    rule: "a replica has exactly one of 'ssh' and 'direct'",
    valid: [[`${S0}/replicas/1`, { id: 'r2', appPort: 8000, ssh: { host: '203.0.113.8', user: 'root' } }]],
    invalid: [
      {
        when: 'a replica with both',
        edits: [[`${S0}/replicas/1/ssh`, { host: '203.0.113.8', user: 'root' }]],
        errors: [[`${S0}/replicas/1`, /must have either 'ssh' or 'direct', not both/]],
      },
      {
        when: 'a replica with neither',
        edits: [[`${S0}/replicas/1/direct`, REMOVE]],
        errors: [[`${S0}/replicas/1`, /must have either 'ssh' or 'direct'\.$/]],
      },
    ],
  },
  {
    rule: 'jump hosts come only with ssh',
    valid: [
      [`${S0}/replicas/0/sshProxy`, { host: '198.51.100.2', user: 'root' }],
      [`${S0}/replicas/0/sshHeadProxy`, { host: '192.0.2.9', port: 2222, user: 'debian', privateKey: TEST_KEY_C }],
    ],
    invalid: [
      {
        when: 'sshProxy on a direct replica',
        edits: [[`${S0}/replicas/1/sshProxy`, { host: '198.51.100.2', user: 'root' }]],
        errors: [[`${S0}/replicas/1/sshProxy`, /is only allowed with 'ssh'/]],
      },
      {
        when: 'sshHeadProxy on a direct replica',
        edits: [[`${S0}/replicas/1/sshHeadProxy`, { host: '192.0.2.9', user: 'root' }]],
        errors: [[`${S0}/replicas/1/sshHeadProxy`, /is only allowed with 'ssh'/]],
      },
      {
        when: 'sshProxy on a replica with neither ssh nor direct',
        edits: [
          [`${S0}/replicas/1/direct`, REMOVE],
          [`${S0}/replicas/1/sshProxy`, { host: '198.51.100.2', user: 'root' }],
        ],
        errors: [
          [`${S0}/replicas/1`, /must have either 'ssh' or 'direct'/],
          [`${S0}/replicas/1/sshProxy`, /is only allowed with 'ssh'/],
        ],
      },
    ],
  },
  {
    rule: 'an ssh replica needs a project with a private key',
    valid: [
      ['/spec/projects/1/sshPrivateKey', TEST_KEY_C],
      [`${S1}/replicas/0`, { id: 'r3', appPort: 80, ssh: { host: 'h', user: 'u' } }],
    ],
    invalid: [
      {
        when: 'an ssh replica in a project without a key',
        edits: [[`${S1}/replicas/0`, { id: 'r3', appPort: 80, ssh: { host: 'h', user: 'u' } }]],
        errors: [[`${S1}/replicas/0/ssh`, /needs a private key: project "research" has no sshPrivateKey/]],
      },
      {
        when: 'an ssh replica whose only key is on its jump host',
        edits: [
          [
            `${S1}/replicas/0`,
            { id: 'r3', appPort: 80, ssh: { host: 'h', user: 'u' }, sshProxy: { host: 'j', user: 'u', privateKey: TEST_KEY_C } },
          ],
        ],
        errors: [[`${S1}/replicas/0/ssh`, /has no sshPrivateKey/]],
      },
    ],
  },
  {
    rule: "a rate-limit header is required with key type 'header' and only there",
    valid: [[`${S0}/rateLimits/-`, { prefix: '/v1/chat', key: { type: 'header', header: 'X-Api-Key' }, rps: 1 }]],
    invalid: [
      {
        when: 'a header key without a header',
        edits: [[`${S0}/rateLimits/0/key`, { type: 'header' }]],
        errors: [[`${S0}/rateLimits/0/key/header`, /is required when key\.type is 'header'/]],
      },
      {
        when: 'an ipAddress key with a header',
        edits: [[`${S0}/rateLimits/0/key/header`, 'X-Api-Key']],
        errors: [[`${S0}/rateLimits/0/key/header`, /is only allowed when key\.type is 'header'/]],
      },
    ],
  },
  {
    rule: 'a service has one rate limit per prefix and key',
    valid: [[`${S0}/rateLimits/-`, { prefix: '/v1/chat/', key: { type: 'ipAddress' }, rps: 1 }]],
    invalid: [
      {
        when: 'the same prefix and key twice',
        edits: [[`${S0}/rateLimits/-`, { prefix: '/v1/chat', key: { type: 'ipAddress' }, rps: 9 }]],
        errors: [[`${S0}/rateLimits/1`, /duplicates another rate limit of this service with the same prefix and key/]],
      },
      {
        when: 'the same header in another case',
        edits: [
          [`${S0}/rateLimits/0/key`, { type: 'header', header: 'X-Api-Key' }],
          [`${S0}/rateLimits/-`, { prefix: '/v1/chat', key: { type: 'header', header: 'x-api-key' }, rps: 9 }],
        ],
        errors: [[`${S0}/rateLimits/1`, /duplicates another rate limit/]],
      },
    ],
  },
  {
    rule: "a model's fields fit its format",
    valid: [
      [`${S0}/model/prefix`, '/openai/v1'],
      [`${S1}/model/chatTemplate`, '{{ messages }}'],
    ],
    invalid: [
      {
        when: "a prefix on a 'tgi' model",
        edits: [[`${S1}/model/prefix`, '/v1']],
        errors: [[`${S1}/model/prefix`, /is only allowed with format 'openai'/]],
      },
      {
        when: "a 'tgi' model without a chatTemplate",
        edits: [[`${S1}/model/chatTemplate`, REMOVE]],
        errors: [[`${S1}/model/chatTemplate`, /is required with format 'tgi'/]],
      },
      {
        when: "a 'tgi' model with an empty chatTemplate",
        edits: [[`${S1}/model/chatTemplate`, '']],
        errors: [[`${S1}/model/chatTemplate`, /is required with format 'tgi'/]],
      },
      {
        when: "a chatTemplate on an 'openai' model",
        edits: [[`${S0}/model/chatTemplate`, '{{ x }}']],
        errors: [[`${S0}/model/chatTemplate`, /is only allowed with format 'tgi'/]],
      },
      {
        when: "an eosToken on an 'openai' model",
        edits: [[`${S0}/model/eosToken`, '</s>']],
        errors: [[`${S0}/model/eosToken`, /is only allowed with format 'tgi'/]],
      },
      {
        when: "an 'openai' prefix with a brace",
        edits: [[`${S0}/model/prefix`, '/v1{']],
        errors: [[`${S0}/model/prefix`, /must not contain .*'\{'.*got "\/v1\{"/]],
      },
    ],
  },
  {
    rule: 'the ACME server is a URL',
    valid: [['/spec/acme/server', 'https://127.0.0.1:14000/dir']],
    invalid: [
      {
        when: 'a server the URL parser refuses',
        edits: [['/spec/acme/server', 'https://[bad']],
        errors: [['/spec/acme/server', /must be a URL; got "https:\/\/\[bad"/]],
      },
    ],
  },
];

describe.each(rules)('semantic: $rule', (r) => checkRule(baseDocument(), r, it));

describe('semantic: document limits', () => {
  const many = (n: number): Array<{ project: string; run: string }> =>
    Array.from({ length: n }, (_, i) => ({ project: 'main', run: `run-${i}` }));

  it(`accepts ${MAX_SERVICES} services`, () => {
    expect(expectValid(edited(baseDocument(), ['/spec/services', many(MAX_SERVICES)])).spec.services).toHaveLength(MAX_SERVICES);
  });

  it(`rejects ${MAX_SERVICES + 1} services with one error on /spec/services`, () => {
    const result = validate(edited(baseDocument(), ['/spec/services', many(MAX_SERVICES + 1)]));
    expect(result).toEqual({ ok: false, errors: [{ path: '/spec/services', message: 'has 20001 services; the limit is 20000.' }] });
  });
});

describe('semantic: several errors at once', () => {
  it('reports every rule a document breaks, not only the first', () => {
    const doc = edited(
      baseDocument(),
      ['/spec/projects/-', { name: 'main' }],
      [`${S1}/domain`, 'llama.gw.example.com'],
      [`${S1}/replicas/0/id`, 'r1'],
      [`${S0}/replicas/1/direct`, REMOVE],
      ['/spec/entrypoints/0/project', 'ghost'],
      ['/spec/entrypoints/-', { project: 'main', domain: 'bad;domain.example.com' }],
    );
    const result = validate(doc);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.errors.map((e) => e.path)).toEqual([
      '/spec/projects/2/name',
      `${S0}/replicas/1`,
      `${S1}/domain`,
      `${S1}/replicas/0/id`,
      '/spec/entrypoints/0/project',
      '/spec/entrypoints/1/domain',
    ]);
  });
});
