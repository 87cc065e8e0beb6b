// Text → document: size limit, malformed YAML and JSON, duplicate keys, alias bombs,
// multi-document streams; loadDocument's SpecError kinds.

import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { detectFormat, loadDocument, MAX_DOCUMENT_BYTES, parseDocument, SpecError, type DocumentFormat } from '../../src/spec/index.js';
import { baseDocument } from './fixtures.js';

function specError(fn: () => unknown): SpecError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(SpecError);
    return err as SpecError;
  }
  return expect.fail('expected a SpecError');
}

const BILLION_LAUGHS = [
  'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
  ...'bcdefghi'.split('').map((c, i) => {
    const prev = 'abcdefghi'[i]!;
    return `${c}: &${c} [${Array(9).fill(`*${prev}`).join(',')}]`;
  }),
].join('\n');

describe('parseDocument', () => {
  it.each<[string, string, DocumentFormat, RegExp]>([
    ['malformed JSON', '{"apiVersion": "x",', 'json', /^Malformed JSON: /],
    ['JSON with a trailing comma', '{"a": 1,}', 'json', /^Malformed JSON: /],
    ['malformed YAML (unclosed flow sequence)', 'spec:\n  projects: [a, b\n', 'yaml', /^Malformed YAML: /],
    ['malformed YAML (bad indentation)', 'spec:\n  a: 1\n   b: 2\n', 'yaml', /^Malformed YAML: /],
    ['YAML with a duplicate key', 'kind: ProxyState\nkind: Other\n', 'yaml', /^Malformed YAML: Map keys must be unique/],
    ['YAML with a duplicate nested key', 'spec:\n  projects: []\n  projects: []\n', 'yaml', /Map keys must be unique/],
    ['a YAML alias bomb ("billion laughs")', BILLION_LAUGHS, 'yaml', /Excessive alias count/],
    ['a multi-document YAML stream', 'kind: ProxyState\n---\nkind: ProxyState\n', 'yaml', /Expected one YAML document, found 2/],
    ['an empty document', '  \n\n', 'yaml', /The document is empty/],
    ['an empty JSON document', '', 'json', /The document is empty/],
    ['a YAML document of comments only', '# nothing here\n', 'yaml', /The document is empty/],
  ])('rejects %s as malformed, at the root path', (_name, text, format, message) => {
    const err = specError(() => parseDocument(text, format));
    expect(err.kind).toBe('malformed');
    expect(err.issues.length).toBeGreaterThan(0);
    expect(err.issues[0]!.path).toBe('');
    expect(err.issues[0]!.message).toMatch(message);
  });

  it.each<[string, string, string, RegExp]>([
    ['a duplicate top-level key', '{"project":"a","auth":true,"auth":false}', '/auth', /the key "auth" appears twice/],
    [
      'a duplicate key in an array element',
      '{"spec":{"services":[{"run":"a"},{"run":"b","auth":true,"auth":false}]}}',
      '/spec/services/1/auth',
      /appears twice/,
    ],
    ['a duplicate spelt with an escape', '{"spec":{"kind":1,"\\u006bind":2}}', '/spec/kind', /appears twice/],
    ['a duplicate after a string holding quotes and braces', '{"a":"\\"},{\\\\","b":1,"b":2}', '/b', /line 1, column 22/],
  ])('rejects JSON with %s as malformed, with the path of the second key', (_name, text, path, message) => {
    const err = specError(() => parseDocument(text, 'json'));
    expect(err.kind).toBe('malformed');
    expect(err.issues).toEqual([{ path, message: expect.stringMatching(message) }]);
  });

  it('accepts the same key in different objects', () => {
    expect(parseDocument('{"a":{"a":1},"b":[{"a":1},{"a":2}],"c":"\\"a\\":"}', 'json')).toEqual({
      a: { a: 1 },
      b: [{ a: 1 }, { a: 2 }],
      c: '"a":',
    });
  });

  it('reports malformed JSON by line and column, without quoting the text', () => {
    const err = specError(() => parseDocument('{\n  "eabHmacKey": "hmacSECRET" x\n}', 'json'));
    expect(err.issues[0]!.message).toBe("Malformed JSON: Expected ',' or '}' after property value (at line 2, column 30).");
    expect(specError(() => parseDocument('hmacSECRET', 'json')).issues[0]!.message).not.toMatch(/hmac|SECRET/);
  });

  it('rejects a document over 16 MiB before parsing it', () => {
    const text = `# ${'x'.repeat(MAX_DOCUMENT_BYTES)}\n`;
    const err = specError(() => parseDocument(text, 'yaml'));
    expect(err.kind).toBe('too-large');
    expect(err.issues).toEqual([{ path: '', message: expect.stringMatching(/the limit is 16777216 bytes \(16 MiB\)/) }]);
  });

  it('counts bytes, not characters: 16 MiB of multi-byte text is too large', () => {
    const text = `{"x": "${'é'.repeat(MAX_DOCUMENT_BYTES / 2)}"}`; // 2 bytes each
    expect(specError(() => parseDocument(text, 'json')).kind).toBe('too-large');
  });

  it('accepts a document of exactly 16 MiB', () => {
    const head = '{"x": "';
    const text = `${head}${'y'.repeat(MAX_DOCUMENT_BYTES - head.length - 2)}"}`;
    expect(Buffer.byteLength(text)).toBe(MAX_DOCUMENT_BYTES);
    expect(parseDocument(text, 'json')).toEqual({ x: expect.any(String) });
  });

  it('accepts a few ordinary YAML aliases', () => {
    expect(parseDocument('hop: &h {host: a, user: u}\nother: *h\n', 'yaml')).toEqual({
      hop: { host: 'a', user: 'u' },
      other: { host: 'a', user: 'u' },
    });
  });

  it('reads YAML 1.2: yes/no/on stay strings', () => {
    expect(parseDocument('a: yes\nb: on\nc: true\n', 'yaml')).toEqual({ a: 'yes', b: 'on', c: true });
  });

  it('parses the same document from YAML and JSON to equal values', () => {
    const doc = baseDocument();
    expect(parseDocument(stringify(doc), 'yaml')).toEqual(parseDocument(JSON.stringify(doc), 'json'));
  });
});

describe('detectFormat', () => {
  it.each([
    ['{"a":1}', undefined, 'json'],
    ['  \n [1]', undefined, 'json'],
    ['a: 1', undefined, 'yaml'],
    ['{"a":1}', 'state.yaml', 'yaml'],
    ['a: 1', 'state.JSON', 'json'],
    ['a: 1', 'state.yml', 'yaml'],
    ['{}', 'state.txt', 'json'],
  ])('%j named %s is %s', (text, file, format) => {
    expect(detectFormat(text, file)).toBe(format);
  });
});

describe('loadDocument', () => {
  it('returns the normalised state of a valid document', () => {
    const state = loadDocument(stringify(baseDocument()));
    expect(state.spec.services.map((s) => `${s.project}/${s.run}`)).toEqual(['main/llama', 'research/mistral']);
  });

  it("throws SpecError 'invalid' with every problem", () => {
    const doc = { apiVersion: 'v0', kind: 'ProxyState', spec: { bogus: 1 } };
    const err = specError(() => loadDocument(JSON.stringify(doc)));
    expect(err.kind).toBe('invalid');
    expect(err.issues.map((i) => i.path).sort()).toEqual(['/apiVersion', '/spec/bogus']);
    expect(err.message).toContain('/spec/bogus: is not a known field of spec.');
  });

  it("throws SpecError 'malformed' for YAML that does not parse", () => {
    expect(specError(() => loadDocument('a: [\n')).kind).toBe('malformed');
  });
});
