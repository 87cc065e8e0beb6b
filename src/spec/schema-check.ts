// The JSON Schema check: compiled once, every error reported, each as a sentence.

import { Ajv, type ErrorObject } from 'ajv';
import {
  FINGERPRINT_PATTERN,
  HOST_PATTERN,
  NAME_PATTERN,
  USER_PATTERN,
  proxyStateSchema,
} from './schema.js';
import type { SpecIssue } from './issues.js';
import { pointerSegment } from './issues.js';

// verbose: errors carry the offending value (`e.data`), which the sentences below quote.
const ajv = new Ajv({ allErrors: true, verbose: true, strict: true, coerceTypes: false, useDefaults: false });
const check = ajv.compile(proxyStateSchema);

/** More errors than this are summarised: a person reads the first screenful. */
export const MAX_REPORTED_ISSUES = 200;

const PATTERN_SENTENCES: Record<string, string> = {
  [NAME_PATTERN]: "must be 1-64 letters, digits, '-' or '_', starting with a letter or digit",
  [HOST_PATTERN]: 'must be a host name or an IP address',
  [USER_PATTERN]: "must be a user name (letters, digits, '_', '.', '-')",
  [FINGERPRINT_PATTERN]: "must be a SHA256 fingerprint as ssh-keygen -l prints it ('SHA256:' + 43 base64 characters)",
  '^[0-9a-f]{64}$': 'must be a sha256 hex digest',
};

export function schemaIssues(doc: unknown): SpecIssue[] {
  if (check(doc)) return [];
  const errors = check.errors ?? [];
  const issues: SpecIssue[] = [];
  const seen = new Set<string>();
  for (const e of errors) {
    const issue = toIssue(e);
    const id = `${issue.path}\u0000${issue.message}`;
    if (seen.has(id)) continue;
    seen.add(id);
    issues.push(issue);
  }
  return issues;
}

function toIssue(e: ErrorObject): SpecIssue {
  const p = e.params as Record<string, unknown>;
  const at = e.instancePath;
  switch (e.keyword) {
    case 'required':
      return { path: `${at}/${pointerSegment(String(p.missingProperty))}`, message: 'is required.' };
    case 'additionalProperties':
      return {
        path: `${at}/${pointerSegment(String(p.additionalProperty))}`,
        message: `is not a known field${fieldContext(at)}.`,
      };
    case 'type':
      return { path: at, message: `must be ${article(String(p.type))}, not ${describe(e.data)}.` };
    case 'const':
      return { path: at, message: `must be '${String(p.allowedValue)}'.` };
    case 'enum':
      return {
        path: at,
        message: `must be one of ${(p.allowedValues as unknown[]).map((v) => `'${String(v)}'`).join(', ')}.`,
      };
    case 'pattern':
      return { path: at, message: `${PATTERN_SENTENCES[String(p.pattern)] ?? `has characters that are not allowed (pattern ${String(p.pattern)})`}; got ${quote(e.data)}.` };
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return { path: at, message: `must be ${String(p.comparison)} ${String(p.limit)}; got ${String(e.data)}.` };
    case 'minLength':
      return { path: at, message: p.limit === 1 ? 'must not be empty.' : `must be at least ${String(p.limit)} characters long.` };
    case 'maxLength':
      return { path: at, message: `must be at most ${String(p.limit)} characters long.` };
    case 'maxItems':
      return { path: at, message: `must have at most ${String(p.limit)} items.` };
    case 'dependencies':
      return {
        path: `${at}/${pointerSegment(String(p.missingProperty))}`,
        message: `is required when ${String(p.property)} is set.`,
      };
    default:
      return { path: at, message: `${e.message ?? 'is invalid'}.` };
  }
}

function fieldContext(at: string): string {
  const last = at.split('/').filter((s) => !/^\d+$/.test(s)).pop();
  return last ? ` of ${last}` : '';
}

function article(type: string): string {
  return /^[aeiou]/.test(type) ? `an ${type}` : `a ${type}`;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return article(typeof v);
}

function quote(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 80 ? `${s.slice(0, 77)}..."` : s;
}
