// The JSON Schema check: compiled once, every error reported, each as a sentence.

import { Ajv, type ErrorObject } from 'ajv';
import {
  FINGERPRINT_PATTERN,
  HOST_PATTERN,
  NAME_PATTERN,
  OWNER_PATTERN,
  PROJECT_PATTERN,
  USER_PATTERN,
  proxyStateSchema,
} from './schema.js';
import type { SpecIssue } from './issues.js';
import { pointerSegment } from './issues.js';
import { SECRET_FIELDS } from './redact.js';

// verbose: errors carry the offending value (`e.data`), which the sentences below quote —
// except under a secret field, where they describe the value without any part of it.
const ajv = new Ajv({ allErrors: true, verbose: true, strict: true, coerceTypes: false, useDefaults: false });
const check = ajv.compile(proxyStateSchema);

/** More errors than this are summarised: a person reads the first screenful. */
export const MAX_REPORTED_ISSUES = 200;

const PATTERN_SENTENCES: Record<string, string> = {
  [NAME_PATTERN]: "must be 1-64 letters, digits, '-' or '_', starting with a letter or digit",
  [PROJECT_PATTERN]: "must be 1-64 letters, digits, '-' or '_'",
  [OWNER_PATTERN]: "must be 1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
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
  return isSecretPath(at) ? secretIssue(e, p, at) : plainIssue(e, p, at);
}

function plainIssue(e: ErrorObject, p: Record<string, unknown>, at: string): SpecIssue {
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
      return {
        path: at,
        message: `${PATTERN_SENTENCES[String(p.pattern)] ?? `has characters that are not allowed (pattern ${String(p.pattern)})`}; got ${quote(e.data)}.`,
      };
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

/** True when the pointer is a secret field or lies inside one, at any depth. */
export function isSecretPath(pointer: string): boolean {
  for (const segment of pointer.split('/')) if (SECRET_FIELDS.has(segment)) return true;
  return false;
}

/**
 * An error under a secret field: the rule that failed and, for a string, where — its
 * length, the position and kind of the first bad character — never the value or a
 * character of it. Only kinds whose sentence cannot carry the value fall through.
 */
function secretIssue(e: ErrorObject, p: Record<string, unknown>, at: string): SpecIssue {
  switch (e.keyword) {
    case 'pattern':
      return {
        path: at,
        message: `${secretPatternRule(String(p.pattern))}; ${secretPatternProblem(e.data, String(p.pattern))} (the value is a secret and is not shown).`,
      };
    case 'type':
      return { path: at, message: `must be ${article(String(p.type))}, not ${describe(e.data)}.` };
    case 'minLength':
      if (p.limit === 1) return { path: at, message: 'must not be empty.' };
      return { path: at, message: `must be at least ${String(p.limit)} characters long; it has ${lengthOf(e.data)}.` };
    case 'maxLength':
      return { path: at, message: `must be at most ${String(p.limit)} characters long; it has ${lengthOf(e.data)}.` };
    case 'required':
    case 'additionalProperties':
    case 'dependencies':
    case 'const':
    case 'enum':
      // These sentences name the field and the schema's own values, never the data.
      return plainIssue(e, p, at);
    default:
      return { path: at, message: 'is not valid (the value is a secret and is not shown).' };
  }
}

function lengthOf(v: unknown): number {
  return typeof v === 'string' ? v.length : 0;
}

const SECRET_PATTERN_SENTENCES: Record<string, string> = {
  '^[A-Za-z0-9_=+/-]{1,512}$': "must be base64 or base64url: 1-512 letters, digits, '-', '_', '+', '/' or '='",
};

function secretPatternRule(pattern: string): string {
  return SECRET_PATTERN_SENTENCES[pattern] ?? PATTERN_SENTENCES[pattern] ?? `has characters that are not allowed (pattern ${pattern})`;
}

/** What is wrong with a secret string against a `^[class]{min,max}$` pattern, without its content. */
function secretPatternProblem(value: unknown, pattern: string): string {
  if (typeof value !== 'string') return 'it is not a string';
  const shape = /^\^(\[[^\]]+\])\{(\d+),(\d+)\}\$$/.exec(pattern);
  if (shape) {
    const max = Number(shape[3]);
    if (value.length > max) return `it has ${value.length} characters`;
    const allowed = new RegExp(`^${shape[1]}$`);
    for (let i = 0; i < value.length; i++) {
      const ch = value[i]!;
      if (!allowed.test(ch)) return `character ${i + 1} of ${value.length} is ${characterKind(ch, i === value.length - 1)}`;
    }
  }
  return `it has ${value.length} characters`;
}

function characterKind(ch: string, last: boolean): string {
  if (ch === '\n' || ch === '\r')
    return last ? 'a line break at the end (a trailing newline from the file it was read from?)' : 'a line break';
  if (/\s/.test(ch)) return last ? 'white space at the end' : 'white space';
  if (/[\u0000-\u001f\u007f]/.test(ch)) return 'a control character';
  if (ch.charCodeAt(0) > 0x7e) return 'a non-ASCII character';
  return 'a character that is not allowed';
}

function fieldContext(at: string): string {
  const last = at
    .split('/')
    .filter((s) => !/^\d+$/.test(s))
    .pop();
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
