// A small, dependency-free unified line diff for the dry-run plan (LCS by dynamic programming;
// Nginx site files are a few dozen lines).

type Op = { t: ' ' | '-' | '+'; line: string };

const CONTEXT = 3;
/** Above this many DP cells, fall back to "replace everything" rather than use 100s of MB. */
const MAX_CELLS = 4_000_000;

function splitLines(s: string): string[] {
  if (s === '') return [];
  const lines = s.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

function editScript(a: string[], b: string[]): Op[] {
  // Trim the common head and tail first: most edits touch a few lines.
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const ops: Op[] = a.slice(0, head).map((line) => ({ t: ' ', line }));
  const am = a.slice(head, a.length - tail);
  const bm = b.slice(head, b.length - tail);
  const n = am.length;
  const m = bm.length;
  if (n * m > MAX_CELLS) {
    ops.push(...am.map((line): Op => ({ t: '-', line })), ...bm.map((line): Op => ({ t: '+', line })));
  } else {
    // lcs[i][j] = LCS length of am[i..] and bm[j..]
    const lcs: Uint32Array[] = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      const row = lcs[i]!;
      const next = lcs[i + 1]!;
      for (let j = m - 1; j >= 0; j--) {
        row[j] = am[i] === bm[j] ? next[j + 1]! + 1 : Math.max(next[j]!, row[j + 1]!);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && am[i] === bm[j]) {
        ops.push({ t: ' ', line: am[i]! });
        i++;
        j++;
      } else if (j < m && (i === n || lcs[i]![j + 1]! >= lcs[i + 1]![j]!)) {
        ops.push({ t: '+', line: bm[j]! });
        j++;
      } else {
        ops.push({ t: '-', line: am[i]! });
        i++;
      }
    }
    // Conventional order inside a change: deletions before additions.
    for (let k = head; k < ops.length;) {
      if (ops[k]!.t === ' ') {
        k++;
        continue;
      }
      let e = k;
      while (e < ops.length && ops[e]!.t !== ' ') e++;
      const run = ops.slice(k, e);
      ops.splice(k, e - k, ...run.filter((o) => o.t === '-'), ...run.filter((o) => o.t === '+'));
      k = e;
    }
  }
  ops.push(...a.slice(a.length - tail).map((line): Op => ({ t: ' ', line })));
  return ops;
}

/**
 * Unified diff of two texts (null = the file does not exist), with 3 lines of context.
 * Returns '' when they are equal.
 */
export function unifiedDiff(oldText: string | null, newText: string | null, name: string): string {
  if (oldText === newText) return '';
  const ops = editScript(splitLines(oldText ?? ''), splitLines(newText ?? ''));
  const out = [oldText === null ? '--- /dev/null' : `--- a/${name}`, newText === null ? '+++ /dev/null' : `+++ b/${name}`];
  // Positions before each op: old and new line counts consumed so far.
  const oldPos: number[] = [];
  const newPos: number[] = [];
  let o = 0;
  let nw = 0;
  for (const op of ops) {
    oldPos.push(o);
    newPos.push(nw);
    if (op.t !== '+') o++;
    if (op.t !== '-') nw++;
  }
  const changed = ops.flatMap((op, i) => (op.t === ' ' ? [] : [i]));
  let k = 0;
  while (k < changed.length) {
    const start = Math.max(0, changed[k]! - CONTEXT);
    let last = changed[k]!;
    while (k + 1 < changed.length && changed[k + 1]! - last <= 2 * CONTEXT) last = changed[++k]!;
    k++;
    const end = Math.min(ops.length, last + CONTEXT + 1);
    const hunk = ops.slice(start, end);
    const oldCount = hunk.filter((op) => op.t !== '+').length;
    const newCount = hunk.filter((op) => op.t !== '-').length;
    const oldStart = oldCount === 0 ? oldPos[start]! : oldPos[start]! + 1;
    const newStart = newCount === 0 ? newPos[start]! : newPos[start]! + 1;
    out.push(`@@ -${oldStart},${oldCount} +${newStart},${newCount} @@`, ...hunk.map((op) => `${op.t}${op.line}`));
  }
  return `${out.join('\n')}\n`;
}
