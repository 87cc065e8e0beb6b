// The system Nginx's main conf on a gateway host: our includes, server_names_hash_bucket_size
// and worker_rlimit_nofile, written only after `nginx -t` passed on the patched text.
//
// The patch edits the operator's file in place (a splice per edit) instead of rewriting it:
// everything we do not need stays byte for byte, so a diff against the backup shows exactly
// our lines. The text is tokenised the way Nginx reads it (comments, quoted strings, blocks),
// so a brace inside a comment or a string never moves a block boundary.

import { execa } from 'execa';
import { chmod, chown, copyFile, constants, mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, normalize } from 'node:path';
import { ProxyError } from '../errors.js';

export interface NginxConfOptions {
  /** The main conf, e.g. /etc/nginx/nginx.conf. */
  nginxConf: string;
  /** The gateway's --sites-dir: `<dir>/*.conf` and `<dir>/sites/*.conf` get included in http {}. */
  sitesDir: string;
  /** argv that tests a main conf; `-c <file>` is appended (the gateway's --test-command). */
  testCommand: string[];
}

export interface NginxConfOutcome {
  changed: boolean;
  /** One line per edit made, for the install's report. */
  edits: string[];
}

export interface NginxConfPatch extends NginxConfOutcome {
  text: string;
}

/** Sites with long names (model services under a wildcard domain) overflow the default 64. */
export const SERVER_NAMES_HASH_BUCKET_SIZE = 128;
/** Each proxied request holds two descriptors; dstack's gateway sets the same limit. */
export const WORKER_RLIMIT_NOFILE = 65535;
/** The first original conf is kept here before we replace it. */
export const BACKUP_SUFFIX = '.dstack-proxy.bak';
const CANDIDATE_SUFFIX = '.dstack-proxy.new';

/** Characters a path may hold to be written unquoted into the conf (and into argv). */
const SAFE_PATH = /^\/[A-Za-z0-9._@+=,:/-]*$/;

/** Paths go into the conf unquoted: refuse anything Nginx would read as syntax. */
export function checkConfPath(what: string, path: string): string {
  if (!isAbsolute(path) || !SAFE_PATH.test(path)) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `${what} must be an absolute path of letters, digits and ._@+=,:/- (no spaces, quotes, semicolons, braces): ${JSON.stringify(path.slice(0, 200))}`,
    );
  }
  const n = normalize(path);
  return n.length > 1 && n.endsWith('/') ? n.slice(0, -1) : n;
}

// ---- tokenising -------------------------------------------------------------------------------

interface Token {
  kind: 'word' | 'open' | 'close' | 'semi' | 'comment';
  /** The word's value with quotes and escapes removed; the comment's text after `#`. */
  value: string;
  start: number;
  end: number;
}

function tokenize(text: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text[i]!;
    if (c === ' ' || c === '\t' || c === '\r' || c === '\n') {
      i++;
      continue;
    }
    const start = i;
    if (c === '#') {
      while (i < n && text[i] !== '\n') i++;
      tokens.push({ kind: 'comment', value: text.slice(start + 1, i), start, end: i });
      continue;
    }
    if (c === '{' || c === '}' || c === ';') {
      i++;
      tokens.push({ kind: c === '{' ? 'open' : c === '}' ? 'close' : 'semi', value: c, start, end: i });
      continue;
    }
    if (c === '"' || c === "'") {
      let value = '';
      i++;
      for (;;) {
        if (i >= n) throw confError(text, start, 'unterminated quoted string');
        const d = text[i]!;
        if (d === '\\' && i + 1 < n) {
          value += text[i + 1];
          i += 2;
          continue;
        }
        i++;
        if (d === c) break;
        value += d;
      }
      tokens.push({ kind: 'word', value, start, end: i });
      continue;
    }
    // A bare word ends at white space or syntax; `${name}` inside it is a variable, not a block,
    // and `#` inside a word is part of it (Nginx starts a comment only where a token starts).
    while (i < n) {
      const d = text[i]!;
      if (d === ' ' || d === '\t' || d === '\r' || d === '\n' || d === ';' || d === '{' || d === '}') break;
      if (d === '$' && text[i + 1] === '{') {
        const close = text.indexOf('}', i);
        if (close < 0) throw confError(text, i, 'unterminated ${...}');
        i = close + 1;
        continue;
      }
      if (d === '\\' && i + 1 < n) {
        i += 2;
        continue;
      }
      i++;
    }
    tokens.push({ kind: 'word', value: text.slice(start, i), start, end: i });
  }
  return tokens;
}

function lineOf(text: string, at: number): number {
  let line = 1;
  for (let i = 0; i < at && i < text.length; i++) if (text[i] === '\n') line++;
  return line;
}

function confError(text: string, at: number, what: string): ProxyError {
  return new ProxyError('DP_ERR_BAD_OPTION', `nginx.conf line ${lineOf(text, at)}: ${what}`);
}

// ---- parsing ----------------------------------------------------------------------------------

interface Directive {
  name: string;
  args: Token[];
  /** The enclosing blocks' names, outermost first: [] is the main context. */
  context: string[];
  start: number;
  /** After the `;`, or after the block's `}`. */
  end: number;
  /** For a block: the offsets of its `{` and `}`. */
  open?: number;
  close?: number;
}

interface Comment {
  token: Token;
  context: string[];
}

interface Parsed {
  directives: Directive[];
  comments: Comment[];
}

function parse(text: string): Parsed {
  const tokens = tokenize(text);
  const directives: Directive[] = [];
  const comments: Comment[] = [];
  const stack: Directive[] = [];
  let pending: Token[] = [];
  const context = () => stack.map((d) => d.name);
  for (const t of tokens) {
    if (t.kind === 'comment') {
      comments.push({ token: t, context: context() });
      continue;
    }
    if (t.kind === 'word') {
      pending.push(t);
      continue;
    }
    if (t.kind === 'semi' || t.kind === 'open') {
      const [head, ...args] = pending;
      if (!head) throw confError(text, t.start, `unexpected "${t.value}"`);
      const d: Directive = { name: head.value, args, context: context(), start: head.start, end: t.end };
      directives.push(d);
      if (t.kind === 'open') {
        d.open = t.start;
        stack.push(d);
      }
      pending = [];
      continue;
    }
    // close
    if (pending.length > 0) throw confError(text, t.start, `"${pending[0]!.value}" has no ";" before "}"`);
    const block = stack.pop();
    if (!block) throw confError(text, t.start, 'unexpected "}"');
    block.close = t.start;
    block.end = t.end;
  }
  if (pending.length > 0) throw confError(text, pending[0]!.start, `"${pending[0]!.value}" has no ";"`);
  if (stack.length > 0) throw confError(text, stack[stack.length - 1]!.start, `the "${stack[stack.length - 1]!.name}" block has no "}"`);
  return { directives, comments };
}

// ---- patching ---------------------------------------------------------------------------------

interface Insert {
  at: number;
  indent: string;
  /** `at` is mid-line: the new directive starts with a newline instead of ending with one. */
  inline: boolean;
}

interface Splice {
  start: number;
  end: number;
  text: string;
}

/** Nginx sizes and counts: `128`, `4k`, `1m`. */
function sizeValue(v: string): number | undefined {
  const m = /^(\d+)([kKmMgG]?)$/.exec(v);
  if (!m) return undefined;
  const mult = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 }[m[2]!.toLowerCase() as '' | 'k' | 'm' | 'g'];
  return Number(m[1]) * mult;
}

function sameContext(a: string[], b: string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** The indentation of the line `at` is on. */
function indentAt(text: string, at: number): string {
  const lineStart = text.lastIndexOf('\n', at - 1) + 1;
  return /^[ \t]*/.exec(text.slice(lineStart))![0];
}

/** True when only white space precedes `at` on its line (a comment that is a whole line). */
function startsLine(text: string, at: number): boolean {
  const lineStart = text.lastIndexOf('\n', at - 1) + 1;
  return /^[ \t]*$/.test(text.slice(lineStart, at));
}

/**
 * Ensures `name value;` in `context` (only the directive's own level): a smaller value is raised,
 * a bigger one kept; missing, it replaces a commented-out line of the same directive, or else it
 * goes in at `insertAt` (an offset at the start of a line).
 */
function ensureAtLeast(
  text: string,
  parsed: Parsed,
  context: string[],
  name: string,
  minimum: number,
  insert: Insert,
  splices: Splice[],
  edits: string[],
): void {
  const found = parsed.directives.filter((d) => d.name === name && sameContext(d.context, context));
  const where = context.length === 0 ? 'the main context' : `the ${context.join(' ')} block`;
  if (found.length > 0) {
    for (const d of found) {
      const arg = d.args[0];
      const value = d.args.length === 1 && arg ? sizeValue(arg.value) : undefined;
      if (value === undefined || !arg) throw confError(text, d.start, `${name} has an argument this patch does not read`);
      if (value >= minimum) continue;
      splices.push({ start: arg.start, end: arg.end, text: String(minimum) });
      edits.push(`${name} ${arg.value} → ${minimum} in ${where} (line ${lineOf(text, d.start)})`);
    }
    return;
  }
  const pattern = new RegExp(`^#\\s*${name}\\s+\\S+\\s*;\\s*$`);
  const commented = parsed.comments.find(
    (c) => sameContext(c.context, context) && pattern.test(`#${c.token.value}`) && startsLine(text, c.token.start),
  );
  if (commented) {
    splices.push({ start: commented.token.start, end: commented.token.end, text: `${name} ${minimum};` });
    edits.push(`${name} ${minimum} in ${where}, in place of the commented-out line ${lineOf(text, commented.token.start)}`);
    return;
  }
  const line = `${insert.indent}${name} ${minimum};`;
  splices.push({ start: insert.at, end: insert.at, text: insert.inline ? `\n${line}` : `${line}\n` });
  edits.push(`${name} ${minimum} added to ${where}`);
}

/** The offset just after the line holding `at` (or the end of the text). */
function afterLine(text: string, at: number): number {
  const nl = text.indexOf('\n', at);
  return nl < 0 ? text.length : nl + 1;
}

/**
 * Where a new line goes after the token ending at `end`: the next line when only white space or
 * a comment follows on this one, else right there (the splice then starts with a newline).
 */
function insertAfter(text: string, end: number, indent: string): Insert {
  const next = afterLine(text, end);
  const rest = text.slice(end, next);
  if (/^[ \t]*(#.*)?\r?\n?$/.test(rest)) return { at: next, indent, inline: false };
  return { at: end, indent, inline: true };
}

/**
 * The pure patch: the text with our includes and limits, and one line per edit. An already
 * patched text comes back unchanged, with `changed: false`.
 */
export function patchNginxConf(text: string, sitesDirInput: string): NginxConfPatch {
  const sitesDir = checkConfPath('sitesDir', sitesDirInput);
  const parsed = parse(text);
  const https = parsed.directives.filter((d) => d.name === 'http' && d.context.length === 0 && d.open !== undefined);
  if (https.length !== 1) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `nginx.conf has ${https.length} http blocks in its main context, this patch needs exactly one`,
    );
  }
  const http = https[0]!;
  const splices: Splice[] = [];
  const edits: string[] = [];

  // Indentation of the http block's own directives, so our lines look like the operator's.
  const firstInside = parsed.directives.find((d) => sameContext(d.context, ['http']));
  const indent = firstInside && startsLine(text, firstInside.start) ? indentAt(text, firstInside.start) : '    ';

  // worker_rlimit_nofile: after worker_processes when there is one (where readers look), else first.
  const wp = parsed.directives.find((d) => d.name === 'worker_processes' && d.context.length === 0);
  const mainInsert = wp ? insertAfter(text, wp.end, '') : { at: 0, indent: '', inline: false };
  ensureAtLeast(text, parsed, [], 'worker_rlimit_nofile', WORKER_RLIMIT_NOFILE, mainInsert, splices, edits);

  // server_names_hash_bucket_size: first thing in http {} (after the `{` line).
  const httpTop = insertAfter(text, http.open! + 1, indent);
  ensureAtLeast(text, parsed, ['http'], 'server_names_hash_bucket_size', SERVER_NAMES_HASH_BUCKET_SIZE, httpTop, splices, edits);

  // The includes, by literal path: the global file (log_format, maps) must come before the sites
  // that use it.
  const globalPath = `${sitesDir}/*.conf`;
  const sitesPath = `${sitesDir}/sites/*.conf`;
  const includes = parsed.directives.filter((d) => d.name === 'include' && sameContext(d.context, ['http']) && d.args.length === 1);
  const globalInc = includes.find((d) => normalize(d.args[0]!.value) === globalPath);
  const sitesInc = includes.find((d) => normalize(d.args[0]!.value) === sitesPath);
  const line = (p: string) => `${indent}include ${p};\n`;
  if (globalInc && sitesInc) {
    if (globalInc.start > sitesInc.start) {
      throw confError(
        text,
        sitesInc.start,
        `include ${sitesPath} comes before include ${globalPath}; the global file must come first, swap the two lines`,
      );
    }
  } else if (globalInc) {
    const at = insertAfter(text, globalInc.end, indent);
    splices.push({ start: at.at, end: at.at, text: at.inline ? `\n${line(sitesPath).trimEnd()}` : line(sitesPath) });
    edits.push(`include ${sitesPath} added to the http block`);
  } else if (sitesInc) {
    const at = text.lastIndexOf('\n', sitesInc.start - 1) + 1;
    splices.push({ start: at, end: at, text: line(globalPath) });
    edits.push(`include ${globalPath} added to the http block`);
  } else {
    // Before the block's closing brace; the brace is put back on a line of its own if it shared one.
    const close = http.close!;
    const lineStart = text.lastIndexOf('\n', close - 1) + 1;
    const alone = /^[ \t]*$/.test(text.slice(lineStart, close));
    const block = `${indent}# the sites of dstack-proxy (its global file first)\n${line(globalPath)}${line(sitesPath)}`;
    if (alone) splices.push({ start: lineStart, end: lineStart, text: block });
    else splices.push({ start: close, end: close, text: `\n${block}` });
    edits.push(`include ${globalPath} and include ${sitesPath} added to the http block`);
  }

  if (splices.length === 0) return { text, changed: false, edits: [] };
  let out = text;
  // From the end backwards, so earlier offsets stay valid; same-offset inserts keep their order.
  const ordered = splices.map((s, i) => ({ s, i })).sort((a, b) => b.s.start - a.s.start || b.i - a.i);
  for (const { s } of ordered) out = out.slice(0, s.start) + s.text + out.slice(s.end);
  return { text: out, changed: true, edits };
}

// ---- writing ----------------------------------------------------------------------------------

/** The last lines of nginx -t's report: enough to name the failing directive, bounded. */
function tail(s: string, lines = 20): string {
  return s.trim().split('\n').slice(-lines).join('\n');
}

/**
 * Patches the system Nginx's main conf: writes the candidate next to it, tests it with
 * `<testCommand> -c <candidate>`, and only then replaces the original (one rename), keeping the
 * first original as `<nginxConf>.dstack-proxy.bak`. Creates sitesDir (0755) so its includes
 * resolve. An already patched conf is not written.
 */
export async function ensureNginxConf(options: NginxConfOptions): Promise<NginxConfOutcome> {
  const nginxConf = checkConfPath('nginxConf', options.nginxConf);
  const sitesDir = checkConfPath('sitesDir', options.sitesDir);
  const [program, ...prefix] = options.testCommand;
  if (!program) throw new ProxyError('DP_ERR_BAD_OPTION', 'testCommand is empty');
  let original: string;
  try {
    original = await readFile(nginxConf, 'utf8');
  } catch (e) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `cannot read ${nginxConf}: ${(e as Error).message}`, undefined, { cause: e });
  }
  const patch = patchNginxConf(original, sitesDir);
  await mkdir(join(sitesDir, 'sites'), { recursive: true, mode: 0o755 });
  await chmod(sitesDir, 0o755);
  if (!patch.changed) return { changed: false, edits: [] };

  const info = await stat(nginxConf);
  const candidate = join(dirname(nginxConf), `${basename(nginxConf)}${CANDIDATE_SUFFIX}`);
  await writeFile(candidate, patch.text, { mode: info.mode & 0o7777 });
  try {
    await chmod(candidate, info.mode & 0o7777);
    if (process.getuid?.() === 0) await chown(candidate, info.uid, info.gid);
    const r = await execa(program, [...prefix, '-c', candidate], { reject: false, all: true, timeout: 60_000, stdin: 'ignore' });
    if (r.exitCode !== 0) {
      const out = tail(String(r.all ?? '')) || (r.timedOut ? 'timed out' : `exit ${r.exitCode}`);
      throw new ProxyError(
        'DP_ERR_BAD_OPTION',
        `${[program, ...prefix].join(' ')} -c <patched ${nginxConf}> failed, ${nginxConf} is unchanged:\n${out}`,
      );
    }
    try {
      await copyFile(nginxConf, `${nginxConf}${BACKUP_SUFFIX}`, constants.COPYFILE_EXCL);
    } catch (e) {
      // The first original is the one worth keeping; a later run leaves it alone.
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    await rename(candidate, nginxConf);
  } finally {
    await rm(candidate, { force: true });
  }
  return { changed: true, edits: patch.edits };
}
