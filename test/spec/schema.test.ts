// Every class of JSON Schema constraint: a valid document and invalid ones, each with the
// exact JSON-pointer path and a message that names the problem.

import { describe, expect, it } from 'vitest';
import { validate } from '../../src/spec/index.js';
import { baseDocument, edited, REMOVE } from './fixtures.js';
import { checkRule, expectErrors, type Rule } from './expect.js';

const S0 = '/spec/services/0';
const R0 = `${S0}/replicas/0`;

const rules: Rule[] = [
  {
    rule: 'apiVersion must be proxy.dstack.ai/v1alpha1',
    valid: [['/apiVersion', 'proxy.dstack.ai/v1alpha1']],
    invalid: [
      {
        when: 'another version',
        edits: [['/apiVersion', 'proxy.dstack.ai/v1']],
        errors: [['/apiVersion', /must be 'proxy\.dstack\.ai\/v1alpha1'/]],
      },
      { when: 'a missing apiVersion', edits: [['/apiVersion', REMOVE]], errors: [['/apiVersion', /is required/]] },
    ],
  },
  {
    rule: 'kind must be ProxyState',
    valid: [['/kind', 'ProxyState']],
    invalid: [
      { when: 'another kind', edits: [['/kind', 'Deployment']], errors: [['/kind', /must be 'ProxyState'/]] },
      { when: 'a missing kind', edits: [['/kind', REMOVE]], errors: [['/kind', /is required/]] },
    ],
  },
  {
    rule: 'required fields must be present',
    valid: [['/spec/services/0/replicas/0/ssh/port', 2222]],
    invalid: [
      { when: 'a missing spec', edits: [['/spec', REMOVE]], errors: [['/spec', /is required/]] },
      { when: 'a service without run', edits: [[`${S0}/run`, REMOVE]], errors: [[`${S0}/run`, /is required/]] },
      { when: 'a replica without appPort', edits: [[`${R0}/appPort`, REMOVE]], errors: [[`${R0}/appPort`, /is required/]] },
      { when: 'an ssh hop without user', edits: [[`${R0}/ssh/user`, REMOVE]], errors: [[`${R0}/ssh/user`, /is required/]] },
      {
        when: 'a rate limit without rps',
        edits: [[`${S0}/rateLimits/0/rps`, REMOVE]],
        errors: [[`${S0}/rateLimits/0/rps`, /is required/]],
      },
      { when: 'a model without format', edits: [[`${S0}/model/format`, REMOVE]], errors: [[`${S0}/model/format`, /is required/]] },
      {
        when: 'an entrypoint without domain',
        edits: [['/spec/entrypoints/0/domain', REMOVE]],
        errors: [['/spec/entrypoints/0/domain', /is required/]],
      },
    ],
  },
  {
    rule: 'unknown fields are rejected at every depth',
    valid: [['/metadata', { generation: 3 }]],
    invalid: [
      { when: 'an unknown top-level field', edits: [['/status', {}]], errors: [['/status', /is not a known field/]] },
      { when: 'an unknown field in spec', edits: [['/spec/extra', 1]], errors: [['/spec/extra', /is not a known field of spec/]] },
      { when: 'an unknown field in acme', edits: [['/spec/acme/eab', 'x']], errors: [['/spec/acme/eab', /is not a known field of acme/]] },
      {
        when: 'an unknown field in a service',
        edits: [[`${S0}/replicaCount`, 2]],
        errors: [[`${S0}/replicaCount`, /is not a known field of services/]],
      },
      {
        when: 'an unknown field in an ssh hop',
        edits: [[`${R0}/ssh/password`, 'hunter2']],
        errors: [[`${R0}/ssh/password`, /is not a known field of ssh/]],
      },
      {
        when: 'an unknown field in a rate-limit key',
        edits: [[`${S0}/rateLimits/0/key/cookie`, 'sid']],
        errors: [[`${S0}/rateLimits/0/key/cookie`, /is not a known field of key/]],
      },
      {
        when: 'a misspelt field (snake_case)',
        edits: [[`${S0}/strip_prefix`, false]],
        errors: [[`${S0}/strip_prefix`, /is not a known field/]],
      },
      {
        when: 'privateKey on the destination ssh hop',
        edits: [[`${R0}/ssh/privateKey`, 'k']],
        errors: [[`${R0}/ssh/privateKey`, /is not a known field of ssh/]],
      },
    ],
  },
  {
    rule: 'fields must have their types',
    valid: [[`${S0}/https`, false]],
    invalid: [
      { when: 'a document that is an array', edits: [['/spec', []]], errors: [['/spec', /must be an object, not an array/]] },
      { when: 'a string for a boolean', edits: [[`${S0}/https`, 'yes']], errors: [[`${S0}/https`, /must be a boolean, not a string/]] },
      { when: 'a string for a port', edits: [[`${R0}/appPort`, '8000']], errors: [[`${R0}/appPort`, /must be an integer, not a string/]] },
      {
        when: 'a fraction for a port',
        edits: [[`${R0}/appPort`, 8000.5]],
        errors: [[`${R0}/appPort`, /must be an integer, not a number/]],
      },
      {
        when: 'an object for a list',
        edits: [['/spec/projects', { main: {} }]],
        errors: [['/spec/projects', /must be an array, not an object/]],
      },
      { when: 'null for an object', edits: [['/spec/acme', null]], errors: [['/spec/acme', /must be an object, not null/]] },
      {
        when: 'a string for rps',
        edits: [[`${S0}/rateLimits/0/rps`, '2.5']],
        errors: [[`${S0}/rateLimits/0/rps`, /must be a number, not a string/]],
      },
      {
        when: 'a number for a name',
        edits: [['/spec/projects/1/name', 7]],
        errors: [['/spec/projects/1/name', /must be a string, not a number/]],
      },
    ],
  },
  {
    rule: 'numbers must be in range',
    valid: [
      [`${R0}/appPort`, 65535],
      [`${S0}/clientMaxBodySize`, 0],
      [`${S0}/rateLimits/0/burst`, 0],
    ],
    invalid: [
      { when: 'port 0', edits: [[`${R0}/appPort`, 0]], errors: [[`${R0}/appPort`, /must be >= 1; got 0/]] },
      { when: 'port 65536', edits: [[`${R0}/appPort`, 65536]], errors: [[`${R0}/appPort`, /must be <= 65535; got 65536/]] },
      {
        when: 'a direct port of 70000',
        edits: [[`${S0}/replicas/1/direct/port`, 70000]],
        errors: [[`${S0}/replicas/1/direct/port`, /must be <= 65535; got 70000/]],
      },
      { when: 'a negative ssh port', edits: [[`${R0}/ssh/port`, -22]], errors: [[`${R0}/ssh/port`, /must be >= 1; got -22/]] },
      { when: 'rps 0', edits: [[`${S0}/rateLimits/0/rps`, 0]], errors: [[`${S0}/rateLimits/0/rps`, /must be > 0; got 0/]] },
      {
        when: 'a negative burst',
        edits: [[`${S0}/rateLimits/0/burst`, -1]],
        errors: [[`${S0}/rateLimits/0/burst`, /must be >= 0; got -1/]],
      },
      {
        when: 'a negative clientMaxBodySize',
        edits: [[`${S0}/clientMaxBodySize`, -1]],
        errors: [[`${S0}/clientMaxBodySize`, /must be >= 0; got -1/]],
      },
      {
        when: 'a negative generation',
        edits: [['/metadata', { generation: -1 }]],
        errors: [['/metadata/generation', /must be >= 0; got -1/]],
      },
    ],
  },
  {
    rule: 'names, hosts and users must match their patterns',
    valid: [
      ['/spec/projects/1/name', 'research'],
      [`${R0}/ssh/host`, '[2001:db8::1]'],
      [`${R0}/ssh/user`, 'ec2-user'],
    ],
    invalid: [
      {
        when: 'a project name with a space',
        edits: [['/spec/projects/1/name', 'my project']],
        errors: [['/spec/projects/1/name', /must be 1-64 letters, digits, '-' or '_'.*got "my project"/]],
      },
      { when: 'a run starting with -', edits: [[`${S0}/run`, '-llama']], errors: [[`${S0}/run`, /must be 1-64 letters/]] },
      { when: 'a replica id with a slash', edits: [[`${R0}/id`, 'a/b']], errors: [[`${R0}/id`, /must be 1-64 letters/]] },
      {
        when: 'an ssh host with a semicolon',
        edits: [[`${R0}/ssh/host`, 'h;rm']],
        errors: [[`${R0}/ssh/host`, /must be a host name or an IP address/]],
      },
      { when: 'an ssh user with a space', edits: [[`${R0}/ssh/user`, 'root x']], errors: [[`${R0}/ssh/user`, /must be a user name/]] },
      {
        when: 'a malformed host key fingerprint',
        edits: [[`${R0}/ssh/hostKeyFingerprint`, 'MD5:aa:bb']],
        errors: [[`${R0}/ssh/hostKeyFingerprint`, /must be a SHA256 fingerprint/]],
      },
      {
        when: 'a metadata hash that is not hex',
        edits: [['/metadata', { hash: 'xyz' }]],
        errors: [['/metadata/hash', /must be a sha256 hex digest/]],
      },
      {
        when: 'an acme server that is not http(s)',
        edits: [['/spec/acme/server', 'ftp://acme.example.com']],
        errors: [['/spec/acme/server', /has characters that are not allowed|pattern/]],
      },
      { when: 'an email with a brace', edits: [['/spec/acme/email', 'ops}@example.com']], errors: [['/spec/acme/email', /pattern/]] },
    ],
  },
  {
    rule: 'enumerations take only their values',
    valid: [[`${S0}/rateLimits/0/key`, { type: 'header', header: 'X-Api-Key' }]],
    invalid: [
      {
        when: 'an unknown model format',
        edits: [[`${S0}/model/format`, 'vllm']],
        errors: [[`${S0}/model/format`, /must be one of 'openai', 'tgi'/]],
      },
      {
        when: 'an unknown rate-limit key type',
        edits: [[`${S0}/rateLimits/0/key/type`, 'cookie']],
        errors: [[`${S0}/rateLimits/0/key/type`, /must be one of 'ipAddress', 'header'/]],
      },
    ],
  },
  {
    rule: 'strings and lists have length limits',
    valid: [[`${S0}/model/name`, 'm'.repeat(256)]],
    invalid: [
      { when: 'an empty model name', edits: [[`${S0}/model/name`, '']], errors: [[`${S0}/model/name`, /must not be empty/]] },
      {
        when: 'a model name of 257 characters',
        edits: [[`${S0}/model/name`, 'm'.repeat(257)]],
        errors: [[`${S0}/model/name`, /must be at most 256 characters long/]],
      },
      {
        when: 'an empty private key',
        edits: [['/spec/projects/0/sshPrivateKey', '']],
        errors: [['/spec/projects/0/sshPrivateKey', /must not be empty/]],
      },
      {
        when: '65 rate limits',
        edits: [[`${S0}/rateLimits`, Array.from({ length: 65 }, (_, i) => ({ prefix: `/p${i}`, key: { type: 'ipAddress' }, rps: 1 }))]],
        errors: [[`${S0}/rateLimits`, /must have at most 64 items/]],
      },
    ],
  },
  {
    rule: 'eabKid and eabHmacKey come together',
    valid: [
      ['/spec/acme/eabKid', 'kid-123'],
      ['/spec/acme/eabHmacKey', 'c2VjcmV0'],
    ],
    invalid: [
      {
        when: 'eabKid without eabHmacKey',
        edits: [['/spec/acme/eabKid', 'kid-123']],
        errors: [['/spec/acme/eabHmacKey', /is required when eabKid is set/]],
      },
      {
        when: 'eabHmacKey without eabKid',
        edits: [['/spec/acme/eabHmacKey', 'c2VjcmV0']],
        errors: [['/spec/acme/eabKid', /is required when eabHmacKey is set/]],
      },
    ],
  },
  {
    // Secrets are described (length, position and kind of the bad character), never quoted.
    rule: 'a bad eabHmacKey is explained without showing it',
    valid: [
      ['/spec/acme/eabKid', 'kid-123'],
      ['/spec/acme/eabHmacKey', 'c2VjcmV0_-+/='],
    ],
    invalid: [
      {
        when: 'a trailing newline',
        edits: [
          ['/spec/acme/eabKid', 'k'],
          ['/spec/acme/eabHmacKey', 'hmacSECRET\n'],
        ],
        errors: [
          ['/spec/acme/eabHmacKey', /^must be base64 or base64url.*; character 11 of 11 is a line break at the end .*not shown\)\.$/],
        ],
      },
      {
        when: 'a space inside',
        edits: [
          ['/spec/acme/eabKid', 'k'],
          ['/spec/acme/eabHmacKey', 'hmac SECRET'],
        ],
        errors: [['/spec/acme/eabHmacKey', /character 5 of 11 is white space/]],
      },
      {
        when: 'more than 512 characters',
        edits: [
          ['/spec/acme/eabKid', 'k'],
          ['/spec/acme/eabHmacKey', 'S'.repeat(513)],
        ],
        errors: [['/spec/acme/eabHmacKey', /it has 513 characters/]],
      },
    ],
  },
];

describe.each(rules)('schema: $rule', (r) => checkRule(baseDocument(), r, it));

describe('schema: whole-document shapes', () => {
  it.each([
    ['null', null, /must be an object, not null/],
    ['an array', [], /must be an object, not an array/],
    ['a string', 'ProxyState', /must be an object, not a string/],
  ])('rejects a document that is %s at the root path', (_name, doc, message) => {
    expectErrors(doc, [['', message]]);
  });

  it('accepts the smallest document: apiVersion, kind and an empty spec', () => {
    const result = validate({ apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec: {} });
    expect(result.ok).toBe(true);
  });

  it('reports every schema error of a document at once', () => {
    const doc = edited(
      baseDocument(),
      ['/kind', 'Pod'],
      ['/spec/extra', true],
      [`${R0}/appPort`, 0],
      [`${S0}/https`, 'yes'],
      ['/spec/services/1/model/format', 'vllm'],
      ['/spec/entrypoints/0/domain', REMOVE],
    );
    const result = validate(doc);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.errors.map((e) => e.path).sort()).toEqual(
      ['/kind', '/spec/extra', `${R0}/appPort`, `${S0}/https`, '/spec/services/1/model/format', '/spec/entrypoints/0/domain'].sort(),
    );
  });

  it('summarises past 200 errors instead of listing thousands', () => {
    const services = Array.from({ length: 500 }, (_, i) => ({ project: 'main', run: `r${i}`, https: 'no' }));
    const result = validate(edited(baseDocument(), ['/spec/services', services]));
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.errors).toHaveLength(201);
    expect(result.errors[200]).toEqual({ path: '', message: '… and 300 more errors.' });
  });
});
