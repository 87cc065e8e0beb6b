// `/proxy/services/<project>/<run>[/<rest>][?query]`, read from the raw request target so the
// replica gets the path and query byte for byte (no decoding, no dot-segment games).

export const SERVICES_PREFIX = '/proxy/services';

export interface ProxyTarget {
  project: string;
  run: string;
  /** After `/<run>`: '' (no trailing slash) or '/…', query excluded, still percent-encoded. */
  rest: string;
  /** '' or '?…' exactly as sent. */
  query: string;
  /** The whole path, query excluded. */
  path: string;
}

/** Null when `url` is not under /proxy/services/<project>/<run>. */
export function parseProxyTarget(url: string): ProxyTarget | null {
  const q = url.indexOf('?');
  const path = q === -1 ? url : url.slice(0, q);
  const query = q === -1 ? '' : url.slice(q);
  if (!path.startsWith(`${SERVICES_PREFIX}/`)) return null;
  const from = SERVICES_PREFIX.length + 1;
  const s1 = path.indexOf('/', from);
  if (s1 === -1 || s1 === from) return null;
  const s2 = path.indexOf('/', s1 + 1);
  const runEnd = s2 === -1 ? path.length : s2;
  if (runEnd === s1 + 1) return null;
  const project = decode(path.slice(from, s1));
  const run = decode(path.slice(s1 + 1, runEnd));
  if (project === null || run === null) return null;
  return { project, run, rest: path.slice(runEnd), query, path };
}

function decode(s: string): string | null {
  if (!s.includes('%')) return s;
  try {
    return decodeURIComponent(s);
  } catch {
    return null;
  }
}

/** The request target sent to the replica. */
export function upstreamTarget(t: ProxyTarget, stripPrefix: boolean): string {
  return (stripPrefix ? t.rest || '/' : t.path) + t.query;
}
