// Terminal output helpers for the client commands: colour only on a TTY and never with
// NO_COLOR (https://no-color.org), aligned tables, ages and durations.

import type { Io } from './command.js';

export interface Paint {
  green(s: string): string;
  red(s: string): string;
  cyan(s: string): string;
  yellow(s: string): string;
  bold(s: string): string;
  dim(s: string): string;
}

const sgr = (open: number, close: number) => (s: string) => `\u001b[${open}m${s}\u001b[${close}m`;
const same = (s: string): string => s;

export function useColour(io: Io): boolean {
  const noColor = io.env.NO_COLOR;
  return io.isTTY && (noColor === undefined || noColor === '');
}

export function paint(io: Io): Paint {
  if (!useColour(io)) return { green: same, red: same, cyan: same, yellow: same, bold: same, dim: same };
  return { green: sgr(32, 39), red: sgr(31, 39), cyan: sgr(36, 39), yellow: sgr(33, 39), bold: sgr(1, 22), dim: sgr(2, 22) };
}

/** Colour a unified diff line by line: + green, - red, @@ cyan, file headers bold. */
export function colourDiff(diff: string, p: Paint): string {
  return diff
    .split('\n')
    .map((line) => {
      if (line.startsWith('+++') || line.startsWith('---')) return p.bold(line);
      if (line.startsWith('+')) return p.green(line);
      if (line.startsWith('-')) return p.red(line);
      if (line.startsWith('@@')) return p.cyan(line);
      return line;
    })
    .join('\n');
}

/** Rows → aligned columns (two spaces apart, last column not padded). */
export function table(header: string[], rows: string[][]): string {
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  return all
    .map((r) =>
      r
        .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** Milliseconds → kubectl-style age: 42s, 5m, 3h, 2d. */
export function age(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h`;
  return `${Math.floor(h / 24)}d`;
}

/** `120s`, `2m`, `1h`, `500ms` or a bare number of seconds → milliseconds; null when malformed. */
export function parseDuration(text: string): number | null {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m) return null;
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  const factor = unit === 'ms' ? 1 : unit === 's' ? 1000 : unit === 'm' ? 60_000 : 3_600_000;
  const ms = n * factor;
  return Number.isFinite(ms) && ms > 0 ? ms : null;
}

/** A value in a field change, short and on one line. */
export function showValue(v: unknown): string {
  if (v === undefined) return '(unset)';
  if (typeof v === 'string') return v === '<redacted>' ? v : JSON.stringify(v);
  // JSON.stringify gives undefined only for a function or a symbol: name its kind.
  const text = JSON.stringify(v) ?? `(${typeof v})`;
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}

export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}
