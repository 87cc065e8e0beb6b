// Text → plain JSON value. YAML through the `yaml` package with duplicate keys, alias
// bombs and multi-document streams refused; JSON through JSON.parse (fast path).

import { parseAllDocuments } from 'yaml';
import { MAX_DOCUMENT_BYTES } from './types.js';
import { SpecError } from './issues.js';

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
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new SpecError('malformed', [{ path: '', message: `Malformed JSON: ${(err as Error).message}.` }]);
  }
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
