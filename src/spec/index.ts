// The desired-state document: parse → validate (schema + semantic) → normalise → hash.

import type { ProxyStateInput } from './input.js';
import { SpecError, type SpecIssue } from './issues.js';
import { normalise } from './normalise.js';
import { detectFormat, parseDocument, type DocumentFormat } from './parse.js';
import { MAX_REPORTED_ISSUES, schemaIssues } from './schema-check.js';
import { semanticIssues } from './semantic.js';
import type { ProxyState } from './types.js';

export * from './types.js';
export { SpecError, formatIssue, type SpecIssue } from './issues.js';
export { detectFormat, parseDocument, parseJsonText, type DocumentFormat } from './parse.js';
export { normalise } from './normalise.js';
export { hashSpec, serviceJson, shareUnchanged, specChunks, specJson, canonicalJson, wholeTextHash } from './hash.js';
export { diffSpecs, deepEqual, type SpecDiff, type ObjectChange, type FieldChange } from './diff.js';
export { redact, scrubSecrets, secretsOf, REDACTED } from './redact.js';
export { domainProblem, prefixProblem, headerProblem } from './semantic.js';
export { servesCors, MODEL_CORS_ORIGIN, MODEL_CORS_METHODS, MODEL_CORS_HEADERS } from './cors.js';

export type ValidationResult = { ok: true; state: ProxyState } | { ok: false; errors: SpecIssue[] };

/** Check a parsed document; on success return it normalised. Never throws on bad input. */
export function validate(doc: unknown): ValidationResult {
  let errors = schemaIssues(doc);
  if (errors.length === 0) errors = semanticIssues(doc as ProxyStateInput);
  if (errors.length > 0) return { ok: false, errors: capIssues(errors) };
  return { ok: true, state: normalise(doc as ProxyStateInput) };
}

/** Text → normalised state, or a SpecError listing every problem. */
export function loadDocument(text: string, format: DocumentFormat = detectFormat(text)): ProxyState {
  const result = validate(parseDocument(text, format));
  if (!result.ok) throw new SpecError('invalid', result.errors);
  return result.state;
}

function capIssues(issues: SpecIssue[]): SpecIssue[] {
  if (issues.length <= MAX_REPORTED_ISSUES) return issues;
  return [...issues.slice(0, MAX_REPORTED_ISSUES), { path: '', message: `… and ${issues.length - MAX_REPORTED_ISSUES} more errors.` }];
}
