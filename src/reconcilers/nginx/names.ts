// Small named helpers the views and templates share: names of Nginx objects, listen addresses,
// quoting. Each has a table test in test/reconcilers/nginx/names.test.ts.

import { createHash } from 'node:crypto';

import { ProxyError } from '../../errors.js';
import type { RateLimitKey } from '../../spec/types.js';

/** First line of every file this loop writes; files without it are foreign and never touched. */
export const MARKER = '# managed by dstack-proxy: do not edit, changes are overwritten';

export const GLOBAL_FILE = '00-dstack-proxy-global.conf';
export const SITES_SUBDIR = 'sites';

/** The file a view renders to, relative to the managed conf dir. */
export function fileNameFor(v: { kind: 'global' } | { kind: 'site' | 'service' | 'entrypoint'; domain: string }): string {
  return v.kind === 'global' ? GLOBAL_FILE : `${SITES_SUBDIR}/${v.domain}.conf`;
}

/** Characters kept in Nginx object names; everything else becomes "_". */
function safeName(part: string): string {
  return part.replace(/[^A-Za-z0-9_-]/g, '_');
}

/** Longest readable part kept in an upstream name; the hash in front keeps truncated names apart. */
const READABLE_MAX = 64;

/**
 * Upstream name for a service key "<project>/<run>": `u<8 hex>.<project>.<run>`, the hex being
 * the start of the SHA-256 of the key. Nginx looks every upstream up by a linear scan that
 * compares names character by character, once per `upstream` block and once per `proxy_pass`,
 * so with thousands of services a shared leading `<project>.run-` makes config parsing
 * quadratic in long compares; the hash first makes names differ in their first characters.
 * The readable part (project and run, dots between, truncated) keeps logs legible; names start
 * with a letter and hold only [A-Za-z0-9_.-], so they never read as an address, and the dot
 * keeps them apart from a plain upstream name of a foreign config.
 */
export function upstreamName(key: string): string {
  const readable = key.split('/').map(safeName).join('.').slice(0, READABLE_MAX);
  return `u${createHash('sha256').update(key).digest('hex').slice(0, 8)}.${readable}`;
}

/**
 * limit_req zone name: per service, rate-limit index and key variable. The key variable is part
 * of the name because Nginx refuses a reload that rebinds an existing zone to another key.
 */
export function zoneName(key: string, index: number, keyVariable: string): string {
  return `${upstreamName(key)}.${index}.${keyVariable.replace(/^\$/, '')}`;
}

/** The Nginx variable a rate limit is keyed by. */
export function limitKeyVariable(key: RateLimitKey): string {
  if (key.type === 'ipAddress') return '$binary_remote_addr';
  const name = key.header.toLowerCase().replace(/-/g, '_');
  if (!/^[a-z0-9_]+$/.test(name)) throw new ProxyError('DP_ERR_BAD_OPTION', `invalid header name ${key.header}`);
  return `$http_${name}`;
}

/**
 * limit_req_zone rate. Nginx takes an integer number of requests per second or per minute, so a
 * whole rps is written per second and anything else per minute (rounded, at least 1r/m).
 */
export function rateFor(rps: number): string {
  if (!(rps > 0) || !Number.isFinite(rps)) throw new ProxyError('DP_ERR_BAD_OPTION', `invalid rps ${rps}`);
  if (rps >= 1 && Number.isInteger(rps)) return `${rps}r/s`;
  return `${Math.max(1, Math.round(rps * 60))}r/m`;
}

/** `listen` argument: "port" for every address, "host:port", "[v6]:port". */
export function listenAddress(host: string, port: number): string {
  if (host === '' || host === '*') return String(port);
  return serverAddress(host, port);
}

/** `server` argument in an upstream: host:port, with IPv6 hosts in brackets. */
export function serverAddress(host: string, port: number): string {
  if (!/^[A-Za-z0-9.:\-[\]]+$/.test(host)) throw new ProxyError('DP_ERR_BAD_OPTION', `invalid host ${host}`);
  return host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`;
}

const BARE = /^[A-Za-z0-9_./:@%+=,~*^-]+$/;

/**
 * Quote a string for an Nginx directive argument. Bare when safe, else single quotes (or double
 * quotes when the text holds a single quote) with backslashes escaped. Nginx interpolates `$`
 * in every string and has no escape for it, and control characters have no business in a
 * config: both are refused.
 */
export function quote(s: string): string {
  if (s.includes('$')) throw new ProxyError('DP_ERR_BAD_OPTION', `"$" cannot be written to an Nginx config: ${s}`);
  if (/[\x00-\x1f\x7f]/.test(s)) throw new ProxyError('DP_ERR_BAD_OPTION', `control character in ${JSON.stringify(s)}`);
  if (s !== '' && BARE.test(s)) return s;
  const escaped = s.replace(/\\/g, '\\\\');
  if (!s.includes("'")) return `'${escaped}'`;
  return `"${escaped.replace(/"/g, '\\"')}"`;
}
