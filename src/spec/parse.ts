// Text → plain JSON value. YAML through the `yaml` package with duplicate keys, alias
// bombs and multi-document streams refused; JSON through JSON.parse (fast path) followed by
// a scan for duplicate keys, which JSON.parse would silently resolve to the last one.

import { parseAllDocuments } from 'yaml';
import { MAX_DOCUMENT_BYTES } from './types.js';
import { SpecError, pointerSegment } from './issues.js';

export type DocumentFormat = 'yaml' | 'json';

/** Aliases a document may expand; a "billion laughs" document needs far more. */
const MAX_ALIAS_COUNT = 50;

/** Guess the format from a file name, else from the first non-blank character. */
export function detectFormat(text: string, fileName?: string): DocumentFormat {
  if (fileName) {
    if (/\.json$/i.test(fileName)) return 'json';
    if (/\.ya?ml$/i.test(fileName)) return 'yaml';
  }
  const first = /\S/.exec(text)?.[0];
  return first === '{' || first === '[' ? 'json' : 'yaml';
}

export function parseDocument(text: string, format: DocumentFormat = detectFormat(text)): unknown {
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > MAX_DOCUMENT_BYTES) {
    throw new SpecError('too-large', [
      { path: '', message: `The document is ${bytes} bytes; the limit is ${MAX_DOCUMENT_BYTES} bytes (16 MiB).` },
    ]);
  }
  if (text.trim() === '') throw new SpecError('malformed', [{ path: '', message: 'The document is empty.' }]);
  return format === 'json' ? parseJson(text) : parseYaml(text);
}

function parseJson(text: string): unknown {
  return parseJsonText(text, 'Malformed JSON');
}

/**
 * JSON text → value, refusing duplicate keys at any depth. Errors never quote the text:
 * it may hold secrets (V8's messages cite the source around the error), so they give a
 * line and column instead. Every stored form of the document (state.json, SQLite rows)
 * goes through here as well as a PUT.
 */
export function parseJsonText(text: string, what = 'Malformed JSON'): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new SpecError('malformed', [{ path: '', message: `${what}: ${jsonErrorSentence(text, (err as Error).message)}.` }]);
  }
  const dup = colonsAfterStrings(text) === keyCount(value) ? undefined : findDuplicateKey(text);
  if (dup) {
    throw new SpecError('malformed', [
      {
        path: dup.path,
        message: `${what}: the key ${describeKey(dup.key)} appears twice in the same object (at ${lineColumn(text, dup.offset)}); JSON.parse would keep only the last one.`,
      },
    ]);
  }
  return value;
}

/** V8's JSON.parse message without its quotation of the source text, with line and column. */
function jsonErrorSentence(text: string, message: string): string {
  const at = /\bat position (\d+)/.exec(message);
  let reason = message
    .replace(/ in JSON at position \d+.*$/, '')
    .replace(/^(Unexpected token) '.*?', .*$/s, '$1')
    .replace(/^(Unexpected token) .*$/s, '$1')
    .replace(/^".*" is not valid JSON$/s, 'Unexpected input');
  if (reason.length > 120) reason = 'Unexpected input';
  return at ? `${reason} (at ${lineColumn(text, Number(at[1]))})` : reason;
}

function lineColumn(text: string, offset: number): string {
  let line = 1;
  let lineStart = 0;
  for (let i = text.indexOf('\n'); i !== -1 && i < offset; i = text.indexOf('\n', i + 1)) {
    line++;
    lineStart = i + 1;
  }
  return `line ${line}, column ${offset - lineStart + 1}`;
}

function describeKey(key: string): string {
  const shown = JSON.stringify(key.length > 64 ? `${key.slice(0, 61)}...` : key);
  return shown;
}

/**
 * An upper bound of the keys written in a valid JSON text: colons right after a quote that
 * is not escaped (a key's colon always is; a colon inside a string only when it opens the
 * string). Equal to keyCount() of the parsed value exactly when no object repeats a key, so
 * the exact scan below runs only on the rare text this cannot clear. It is cheap: indexOf
 * hops from colon to colon.
 */
function colonsAfterStrings(text: string): number {
  let n = 0;
  for (let i = text.indexOf(':'); i !== -1; i = text.indexOf(':', i + 1)) {
    let j = i - 1;
    let c = text.charCodeAt(j);
    while (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) c = text.charCodeAt(--j);
    if (c !== QUOTE) continue;
    if (!isEscaped(text, j)) n++;
  }
  return n;
}

/** The own keys of every object in a JSON value (iterative: nesting depth is the sender's choice). */
function keyCount(value: unknown): number {
  let n = 0;
  const todo: unknown[] = [value];
  while (todo.length > 0) {
    const v = todo.pop();
    if (typeof v !== 'object' || v === null) continue;
    if (Array.isArray(v)) {
      for (const x of v) if (typeof x === 'object' && x !== null) todo.push(x);
      continue;
    }
    const o = v as Record<string, unknown>;
    for (const k in o) {
      n++;
      const x = o[k];
      if (typeof x === 'object' && x !== null) todo.push(x);
    }
  }
  return n;
}

interface Frame {
  /** The keys seen so far (objects), or undefined (arrays). */
  keys: Set<string> | undefined;
  /** The key of the current member (objects). */
  segment: string;
  /** The index of the current element (arrays). */
  index: number;
  expectKey: boolean;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The first duplicate key of a text JSON.parse has accepted, with the JSON pointer of the
 * second occurrence. One pass over every character: slower than the count above, so it runs
 * only to locate a duplicate (or to clear a text with a string that starts with ':').
 */
function findDuplicateKey(text: string): { path: string; key: string; offset: number } | undefined {
  const stack: Frame[] = [];
  let top: Frame | undefined;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      let end = text.indexOf('"', i + 1);
      while (isEscaped(text, end)) end = text.indexOf('"', end + 1);
      if (top?.keys && top.expectKey) {
        const raw = text.slice(i + 1, end);
        const key = raw.includes('\\') ? (JSON.parse(`"${raw}"`) as string) : raw;
        if (top.keys.has(key)) {
          const parents = stack
            .slice(0, -1)
            .map((f) => `/${f.keys ? pointerSegment(f.segment) : f.index}`)
            .join('');
          return { path: `${parents}/${pointerSegment(key)}`, key, offset: i };
        }
        top.keys.add(key);
        top.segment = key;
        top.expectKey = false;
      }
      i = end;
    } else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      top = { keys: c === 0x7b ? new Set() : undefined, segment: '', index: 0, expectKey: c === 0x7b };
      stack.push(top);
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      stack.pop();
      top = stack[stack.length - 1];
    } else if (c === 0x2c /* , */ && top) {
      if (top.keys) top.expectKey = true;
      else top.index++;
    }
  }
  return undefined;
}

/** Whether the quote at `at` is preceded by an odd number of backslashes. */
function isEscaped(text: string, at: number): boolean {
  let k = at - 1;
  while (text.charCodeAt(k) === BACKSLASH) k--;
  return (at - 1 - k) % 2 === 1;
}

function parseYaml(text: string): unknown {
  const docs = parseAllDocuments(text, { uniqueKeys: true, prettyErrors: true, strict: true });
  if (!Array.isArray(docs) || docs.length === 0) {
    // An empty stream: parseAllDocuments returns an EmptyStream object, or no documents
    // when the text is only comments.
    throw new SpecError('malformed', [{ path: '', message: 'The document is empty.' }]);
  }
  if (docs.length !== 1) {
    throw new SpecError('malformed', [
      { path: '', message: `Expected one YAML document, found ${docs.length} (a '---' separated stream).` },
    ]);
  }
  const doc = docs[0]!;
  const problems = [...doc.errors];
  if (problems.length > 0) {
    throw new SpecError(
      'malformed',
      problems.slice(0, 20).map((e) => ({ path: '', message: `Malformed YAML: ${oneLine(e.message)}` })),
    );
  }
  try {
    return doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT });
  } catch (err) {
    throw new SpecError('malformed', [{ path: '', message: `Malformed YAML: ${oneLine((err as Error).message)}` }]);
  }
}

function oneLine(s: string): string {
  return s.split('\n')[0]!.trim();
}
