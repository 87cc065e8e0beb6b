// The addresses of the load balancers in front of the gateway (--trusted-proxies). They go into
// the global Nginx file as they are written here, so each is checked strictly first: an IPv4 or
// IPv6 address (no zone) with an optional prefix length, and no host bits beyond the prefix
// (Nginx would only warn and trust the whole network). Nothing else can reach the config.

import { isIP } from 'node:net';
import { ProxyError } from '../../errors.js';

/** More than this is a mistake (a cloud's load balancers fit in a handful of networks). */
export const MAX_TRUSTED_PROXIES = 256;

const PREFIX = /^(0|[1-9][0-9]{0,2})$/;

/**
 * `10.0.0.0/8, 192.0.2.7 ,2001:db8::/32` → the entries, each checked, duplicates dropped.
 * Empty or blank: none (the feature is off). A bad entry throws DP_ERR_BAD_OPTION naming it.
 */
export function parseTrustedProxies(raw: string, where = '--trusted-proxies'): string[] {
  const out: string[] = [];
  for (const part of raw.split(',')) {
    const entry = part.trim();
    if (entry === '') continue;
    checkTrustedProxy(entry, where);
    if (!out.includes(entry)) out.push(entry);
  }
  if (out.length > MAX_TRUSTED_PROXIES) {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${where}: at most ${MAX_TRUSTED_PROXIES} addresses or networks, got ${out.length}`);
  }
  return out;
}

/** Throws DP_ERR_BAD_OPTION unless `entry` is `address` or `address/prefix` as described above. */
export function checkTrustedProxy(entry: string, where = '--trusted-proxies'): void {
  const bad = (why: string): never => {
    throw new ProxyError('DP_ERR_BAD_OPTION', `${where}: ${JSON.stringify(entry)} ${why}`);
  };
  if (typeof entry !== 'string') bad('is not a string');
  const slash = entry.indexOf('/');
  const address = slash < 0 ? entry : entry.slice(0, slash);
  // A zone (fe80::1%eth0) passes net.isIP but means nothing to Nginx.
  const family = address.includes('%') ? 0 : isIP(address);
  if (family === 0) bad('is not an IPv4 or IPv6 address (with an optional /prefix length)');
  const bits = family === 4 ? 32 : 128;
  if (slash < 0) return;
  const prefixText = entry.slice(slash + 1);
  const prefix = PREFIX.test(prefixText) ? Number(prefixText) : NaN;
  if (!(prefix <= bits)) bad(`has a bad prefix length (0 to ${bits} for IPv${family})`);
  const bytes = family === 4 ? address.split('.').map(Number) : ipv6Bytes(address);
  for (let bit = prefix; bit < bits; bit++) {
    if ((bytes[bit >> 3]! >> (7 - (bit & 7))) & 1) bad(`has bits set beyond its /${prefix} prefix`);
  }
}

/** The 16 bytes of an IPv6 address net.isIP accepted (`::` and a dotted IPv4 tail allowed). */
function ipv6Bytes(address: string): number[] {
  let text = address;
  let v4: number[] = [];
  const lastColon = text.lastIndexOf(':');
  if (text.includes('.', lastColon)) {
    v4 = text
      .slice(lastColon + 1)
      .split('.')
      .map(Number);
    text = `${text.slice(0, lastColon + 1)}0:0`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const groupsOf = (s: string | undefined): string[] => (s ? s.split(':') : []);
  const h = groupsOf(head);
  const t = groupsOf(tail);
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  const bytes = groups.flatMap((g) => {
    const n = parseInt(g, 16);
    return [n >> 8, n & 0xff];
  });
  if (v4.length === 4) bytes.splice(12, 4, ...v4);
  return bytes;
}
