// `/proxy/services/<project>/<run>[/<rest>][?query]`. Routing and rate-limit prefixes read the
// normalised path, as Nginx matches locations: percent-encoded unreserved characters decoded,
// dot segments removed, repeated slashes merged, so `%76`, `//` and `/./` name the same path
// as `v`, `/` and `/`. The replica still gets the target as sent, byte for byte, whenever that
// spelling resolves to the same path; only a target whose dot segments climb out of where we
// matched it is sent normalised (else the replica could resolve it to a path the limits did not see).

import { ROUTER_ALLOWED_PATHS } from '../spec/types.js';

export const SERVICES_PREFIX = '/proxy/services';
/** What every proxied path starts with: a cheap first test before parseProxyTarget. */
export const SERVICES_PATH = `${SERVICES_PREFIX}/`;

export interface ProxyTarget {
  project: string;
  run: string;
  /** After `/<run>`, as forwarded: '' (no trailing slash) or '/…', query excluded, still percent-encoded. */
  rest: string;
  /**
   * After `/<run>` in the normalised path, every percent-escape decoded: what rate-limit
   * prefixes are matched against ('' when the path ends at the run).
   */
  match: string;
  /** '' or '?…' exactly as sent. */
  query: string;
  /** The whole path as sent, query excluded. */
  path: string;
}

/** Null when `url` is not under /proxy/services/<project>/<run>. */
export function parseProxyTarget(url: string): ProxyTarget | null {
  const q = url.indexOf('?');
  const path = q === -1 ? url : url.slice(0, q);
  const query = q === -1 ? '' : url.slice(q);
  const norm = normalisePath(path);
  const s = splitService(norm);
  if (s === null) return null;
  const normRest = norm.slice(s.runEnd);
  let rest = normRest;
  if (norm !== path) {
    // The raw remainder, when the raw spelling names the same service and resolves to the same path.
    const raw = splitService(path);
    if (raw !== null && raw.project === s.project && raw.run === s.run) {
      const rawRest = path.slice(raw.runEnd);
      if (rawRest === normRest || normalisePath(rawRest === '' ? '/' : rawRest) === (normRest === '' ? '/' : normRest)) rest = rawRest;
    }
  }
  // Decoded once, as Nginx does: `%252F` matches as `%2F`, not as `/`.
  const match = normRest.includes('%') ? removeDotSegments(decodeAll(normRest)) : normRest;
  return { project: s.project, run: s.run, rest, match, query, path };
}

function splitService(path: string): { project: string; run: string; runEnd: number } | null {
  if (!path.startsWith(SERVICES_PATH)) return null;
  const from = SERVICES_PATH.length;
  const s1 = path.indexOf('/', from);
  if (s1 === -1 || s1 === from) return null;
  const s2 = path.indexOf('/', s1 + 1);
  const runEnd = s2 === -1 ? path.length : s2;
  if (runEnd === s1 + 1) return null;
  const project = decode(path.slice(from, s1));
  const run = decode(path.slice(s1 + 1, runEnd));
  if (project === null || run === null) return null;
  return { project, run, runEnd };
}

function decode(s: string): string | null {
  if (!s.includes('%')) return s;
  try {
    return decodeURIComponent(s);
  } catch {
    return null;
  }
}

/**
 * An absolute path ('/…') with percent-encoded unreserved characters (RFC 3986 §2.3) decoded,
 * dot segments removed (§5.2.4; `..` at the root stays at the root) and empty segments dropped.
 * Returned as is (no allocation) when there is nothing to do: the common case.
 */
export function normalisePath(path: string): string {
  const pct = path.indexOf('%') !== -1;
  if (!pct && path.indexOf('//') === -1 && path.indexOf('/.') === -1) return path;
  return removeDotSegments(pct ? path.replace(ESCAPE, decodeUnreserved) : path);
}

/** Dot segments removed and empty segments dropped, nothing decoded. */
function removeDotSegments(path: string): string {
  if (path.indexOf('//') === -1 && path.indexOf('/.') === -1) return path;
  const segments = path.split('/');
  const out: string[] = [];
  const lastIndex = segments.length - 1;
  for (let i = 1; i <= lastIndex; i++) {
    const seg = segments[i]!;
    if (seg === '..') out.pop();
    else if (seg !== '.' && seg !== '') {
      out.push(seg);
      continue;
    }
    // A path ending in `/`, `/.` or `/..` names a directory: keep its trailing slash.
    if (i === lastIndex) out.push('');
  }
  return `/${out.join('/')}`;
}

const ESCAPE = /%([0-9A-Fa-f]{2})/g;

function decodeUnreserved(escape: string, hex: string): string {
  const c = parseInt(hex, 16);
  const unreserved =
    (c >= 0x41 && c <= 0x5a) ||
    (c >= 0x61 && c <= 0x7a) ||
    (c >= 0x30 && c <= 0x39) ||
    c === 0x2d ||
    c === 0x2e ||
    c === 0x5f ||
    c === 0x7e;
  return unreserved ? String.fromCharCode(c) : escape;
}

/** Every escape decoded, one byte to one latin1 character (for matching only, never forwarded). */
function decodeAll(path: string): string {
  return path.replace(ESCAPE, (_e, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

/** The request target sent to the replica. */
export function upstreamTarget(t: ProxyTarget, stripPrefix: boolean): string {
  return (stripPrefix ? t.rest || '/' : t.path) + t.query;
}

/**
 * Whether a service with the router allowlist serves `match` (ProxyTarget.match, the normalised
 * path after the run; '' is the run itself, '/'). Nginx's locations read the same normalised
 * path, so `/v1/../admin` is `/admin` to both.
 */
export function routerPathAllowed(match: string): boolean {
  for (const a of ROUTER_ALLOWED_PATHS) {
    if (a.exact !== undefined ? match === a.exact : match.startsWith(a.prefix!)) return true;
  }
  return false;
}

/** What a path outside the allowlist gets (403), in dstack's in-server proxy's words. */
export const ROUTER_PATH_REFUSED = 'Path is not allowed for this service';
