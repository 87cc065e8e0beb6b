// Assertions on validate(): the exact JSON-pointer paths, and messages that name the problem.

import { expect } from 'vitest';
import { validate, type ProxyState } from '../../src/spec/index.js';
import { edited, type Edit } from './fixtures.js';

/** [JSON pointer, what the message must say] for each expected error, in reported order. */
export type Expected = Array<readonly [path: string, message: RegExp]>;

export interface Rule {
  /** The rule, as a sentence. */
  rule: string;
  /** Edits to baseDocument() that give a document following the rule. */
  valid: Edit[];
  invalid: Array<{ when: string; edits: Edit[]; errors: Expected }>;
}

export function expectValid(doc: unknown): ProxyState {
  const result = validate(doc);
  if (!result.ok) expect.fail(`expected a valid document, got ${JSON.stringify(result.errors, null, 2)}`);
  return result.state;
}

export function expectErrors(doc: unknown, expected: Expected): void {
  const result = validate(doc);
  if (result.ok) expect.fail('expected the document to be rejected, but it validated');
  expect(result.errors.map((e) => e.path)).toEqual(expected.map(([path]) => path));
  result.errors.forEach((e, i) => expect(e.message).toMatch(expected[i]![1]));
}

export function checkRule(base: unknown, r: Rule, it: (name: string, fn: () => void) => void): void {
  it(`accepts a document that follows it`, () => {
    expectValid(edited(base, ...r.valid));
  });
  for (const c of r.invalid) {
    it(`rejects ${c.when}`, () => {
      expectErrors(edited(base, ...c.edits), c.errors);
    });
  }
}
