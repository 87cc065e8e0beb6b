// Nothing that reaches an Nginx file can carry Nginx syntax: domains, rate-limit and model
// prefixes, header names. Each case goes through validate() with its exact path.

import { describe, expect, it } from 'vitest';
import { domainProblem, headerProblem, prefixProblem } from '../../src/spec/index.js';
import { baseDocument, edited } from './fixtures.js';
import { expectErrors, expectValid } from './expect.js';

const DOMAIN = '/spec/services/0/domain';
const ENTRY_DOMAIN = '/spec/entrypoints/0/domain';
const label = (n: number): string => 'a'.repeat(n);

describe('domains', () => {
  it.each([
    ['a semicolon', 'a;b.example.com', /";" is not allowed/],
    ['an opening brace', 'a{.example.com', /"\{" is not allowed/],
    ['a closing brace', 'a}.example.com', /"\}" is not allowed/],
    ['a space', 'a b.example.com', /must not contain spaces or line breaks/],
    ['a newline', 'a.example.com\nserver_name evil', /must not contain spaces or line breaks/],
    ['a tab', 'a.example.com\t', /must not contain spaces or line breaks/],
    ['a dollar sign', '$host.example.com', /"\$" is not allowed/],
    ['a double quote', 'a".example.com', /"\\"" is not allowed/],
    ['a single quote', "a'.example.com", /"'" is not allowed/],
    ['a trailing dot', 'a.example.com.', /must not end with a dot/],
    ['an IDN without punycode', 'bücher.example', /must be ASCII: write an internationalised name in punycode/],
    ['a wildcard', '*.example.com', /must not be a wildcard/],
    ['254 characters', `${label(63)}.${label(63)}.${label(63)}.${label(62)}`, /must be at most 253 characters long; got 254/],
    ['a label of 64 characters', `${label(64)}.example.com`, /has a label longer than 63 characters/],
    ['an empty label', 'a..example.com', /must not contain an empty label/],
    ['a leading dot', '.example.com', /must not contain an empty label/],
    ['a label starting with -', '-a.example.com', /has a label that starts or ends with '-'/],
    ['a label ending with -', 'a-.example.com', /has a label that starts or ends with '-'/],
    ['an empty string', '', /must not be empty/],
    ['a URL', 'https://a.example.com', /":" is not allowed/],
    ['a slash', 'a.example.com/x', /"\/" is not allowed/],
    ['an underscore', 'a_b.example.com', /"_" is not allowed/],
  ])('rejects %s, on a service and on an entrypoint', (_name, domain, message) => {
    expectErrors(edited(baseDocument(), [DOMAIN, domain]), [[DOMAIN, message]]);
    expectErrors(edited(baseDocument(), [ENTRY_DOMAIN, domain]), [[ENTRY_DOMAIN, message]]);
    expect(domainProblem(domain)).not.toBeNull();
  });

  it.each([
    ['a single label', 'localhost'],
    ['punycode', 'xn--bcher-kva.example'],
    ['digits and hyphens', '1-2-3.gw.example.com'],
    ['a label of 63 characters', `${label(63)}.example.com`],
    ['253 characters', `${label(63)}.${label(63)}.${label(63)}.${label(61)}`],
  ])('accepts %s', (_name, domain) => {
    expect(domainProblem(domain)).toBeNull();
    expect(expectValid(edited(baseDocument(), [DOMAIN, domain])).spec.services[0]!.domain).toBe(domain);
  });

  it('accepts upper case and normalises it to lower case', () => {
    const state = expectValid(edited(baseDocument(), [DOMAIN, 'LLaMA.GW.Example.COM'], [ENTRY_DOMAIN, 'Gateway.GW.example.com']));
    expect(state.spec.services.map((s) => s.domain)).toContain('llama.gw.example.com');
    expect(state.spec.entrypoints[0]!.domain).toBe('gateway.gw.example.com');
  });
});

describe('prefixes (rate limits and openai models)', () => {
  const RATE = '/spec/services/0/rateLimits/0/prefix';
  const MODEL = '/spec/services/0/model/prefix';
  it.each([
    ['a space', '/v1 chat', /must not contain spaces/],
    ['an opening brace', '/v1{', /must not contain .*'\{'/],
    ['a closing brace', '/v1}', /must not contain .*'\}'/],
    ['a semicolon', '/v1;return 200', /must not contain .*';'/],
    ['a dollar sign', '/$uri', /must not contain .*'\$'/],
    ['a double quote', '/v1"', /must not contain .*quotes/],
    ['a single quote', "/v1'", /must not contain .*quotes/],
    ['a backslash', '/v1\\', /must not contain .*'\\'/],
    ['a hash', '/v1#', /must not contain .*'#'/],
    ['a newline', '/v1\nlocation /', /must not contain spaces/],
    ['a control character', '/v1\u0001', /control characters/],
    ['no leading slash', 'v1/chat', /must start with '\/'/],
    ['an empty string', '', /must start with '\/'/],
  ])('rejects %s', (_name, prefix, message) => {
    expectErrors(edited(baseDocument(), [RATE, prefix]), [[RATE, message]]);
    expectErrors(edited(baseDocument(), [MODEL, prefix]), [[MODEL, message]]);
    expect(prefixProblem(prefix)).not.toBeNull();
  });

  it.each([['/'], ['/v1/chat/completions'], ['/a-b_c.d~e%20f'], ['/v1/']])('accepts %s', (prefix) => {
    expect(prefixProblem(prefix)).toBeNull();
    expectValid(edited(baseDocument(), [RATE, prefix], [MODEL, prefix]));
  });
});

describe('rate-limit header names', () => {
  const KEY = '/spec/services/0/rateLimits/0/key';
  it.each([
    ['a dollar sign', 'X-Api$Key'],
    ['a space', 'X Api-Key'],
    ['a colon', 'X-Api-Key:'],
    ['a semicolon', 'X;'],
    ['a brace', 'X{'],
    ['an underscore (Nginx folds it with -)', 'X_Api_Key'],
    ['an empty name', ''],
    ['65 characters', 'X'.repeat(65)],
  ])('rejects %s', (_name, header) => {
    expectErrors(edited(baseDocument(), [KEY, { type: 'header', header }]), [[`${KEY}/header`, /must be an HTTP header name/]]);
    expect(headerProblem(header)).not.toBeNull();
  });

  it('accepts a token header name and normalises it to lower case', () => {
    const state = expectValid(edited(baseDocument(), [KEY, { type: 'header', header: 'X-Api-Key' }]));
    expect(state.spec.services.find((s) => s.run === 'llama')!.rateLimits[0]!.key).toEqual({ type: 'header', header: 'x-api-key' });
  });
});
