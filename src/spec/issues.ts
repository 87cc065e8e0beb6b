// What a rejected document reports: one {path, message} per problem, path a JSON pointer.

export interface SpecIssue {
  /** JSON pointer into the submitted document ('' = the whole document). */
  path: string;
  message: string;
}

export type SpecErrorKind = 'malformed' | 'too-large' | 'invalid';

export class SpecError extends Error {
  readonly kind: SpecErrorKind;
  readonly issues: SpecIssue[];

  constructor(kind: SpecErrorKind, issues: SpecIssue[]) {
    super(issues.map(formatIssue).join('\n'));
    this.name = 'SpecError';
    this.kind = kind;
    this.issues = issues;
  }
}

export function formatIssue(issue: SpecIssue): string {
  return `${issue.path || '/'}: ${issue.message}`;
}

/** Escape one JSON-pointer segment (RFC 6901). */
export function pointerSegment(s: string | number): string {
  return String(s).replace(/~/g, '~0').replace(/\//g, '~1');
}
