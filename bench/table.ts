// The benchmark table: every row says what was measured, the figure, the target, and how far
// ahead of the peer (dstack's Python gateway) or of a baseline measured in the same run.

export interface Row {
  id: string;
  name: string;
  value: number;
  unit: string;
  /** e.g. '≤ 500 ms'. */
  target?: string;
  /** Whether `value` meets the target. */
  ok?: boolean;
  /** What the row is compared with, and its figure in the same unit. */
  baseline?: { name: string; value: number; measured: 'same run' | 'published' };
  /** 'lower' when smaller is better (times, memory), 'higher' for throughput. */
  better?: 'lower' | 'higher';
  note?: string;
}

export function comparison(row: Row): string {
  const b = row.baseline;
  if (!b) return '';
  const lowerBetter = (row.better ?? 'lower') === 'lower';
  let factor: string;
  if (row.value === 0 || b.value === 0) {
    factor = row.value === b.value ? 'equal' : lowerBetter ? (row.value === 0 ? `${fmt(b.value)} → 0` : 'worse') : 'n/a';
  } else {
    const x = lowerBetter ? b.value / row.value : row.value / b.value;
    factor = `${x >= 10 ? Math.round(x) : x >= 0.01 ? x.toFixed(2) : x.toPrecision(1)}× ${x >= 1 ? 'better' : 'worse'}`;
  }
  return `${factor} than ${b.name} (${fmt(b.value)} ${row.unit}, ${b.measured})`;
}

export function fmt(v: number): string {
  if (Number.isInteger(v)) return v.toLocaleString('en-US');
  if (Math.abs(v) >= 100) return Math.round(v).toLocaleString('en-US');
  if (Math.abs(v) >= 1) return v.toFixed(1);
  return v.toPrecision(2);
}

export function renderTable(rows: Row[]): string {
  const head = ['id', 'benchmark', 'result', 'target', 'vs baseline'];
  const body = rows.map((r) => [
    r.id,
    r.name,
    `${fmt(r.value)} ${r.unit}`,
    r.target ? `${r.target} ${r.ok === undefined ? '' : r.ok ? '✓' : '✗'}`.trim() : '',
    comparison(r),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]): string => `| ${cells.map((c, i) => c.padEnd(widths[i]!)).join(' | ')} |`;
  return [line(head), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...body.map(line)].join('\n');
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

/**
 * DSTACK_PROXY_BENCH_ONLY: a comma-separated list of row ids (`P5*` takes every id starting
 * with P5). Sections skip the measurements whose rows are not listed, so a few rows can be run
 * alone (with the section names on the command line, the other sections do not start at all).
 * Unset: every row.
 */
export function wanted(id: string, only = process.env.DSTACK_PROXY_BENCH_ONLY): boolean {
  if (!only) return true;
  return only
    .split(',')
    .map((t) => t.trim())
    .filter(Boolean)
    .some((t) => (t.endsWith('*') ? id.startsWith(t.slice(0, -1)) : id === t));
}
