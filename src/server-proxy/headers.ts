// Header rules of the in-server proxy, as pure functions over Node's raw header lists
// (`[name, value, name, value, …]`, names as the client sent them):
//   request  → hop-by-hop stripped (RFC 9110 §7.6.1, plus any header named in Connection),
//              X-Forwarded-For/-Proto/-Host and X-Real-IP set, Authorization dropped when the
//              service uses proxy auth (the token is the user's credential for us, not the replica's);
//   response → hop-by-hop stripped, the replica's Server, Date and Content-Length dropped (Node adds
//              its own Date; the relay sets the length it checked).

/** Headers that describe one connection, never forwarded (lower case). */
export const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  // Not hop-by-hop by the RFC, but answered by our own server (100 Continue).
  'expect',
]);

const FORWARDED = new Set(['x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-real-ip']);
// Content-Length too: the proxy frames what it relays itself (a copy of the replica's framing
// would let a replica that lies about its length split the client's connection).
const RESPONSE_DROP = new Set(['server', 'date', 'content-length']);

export interface ForwardContext {
  /** The client's address (the TCP peer). */
  clientIp: string;
  /** 'http' or 'https', as the client reached us. */
  proto: string;
  /** Drop Authorization: the service uses proxy auth. */
  dropAuthorization: boolean;
  /** Keep Upgrade / Connection: upgrade (a WebSocket handshake). */
  upgrade?: boolean;
}

/** Names listed in a Connection header value, lower case, beyond the usual close/keep-alive. */
function addConnectionTokens(value: string, out: Set<string>): void {
  for (const t of value.split(',')) {
    const name = t.trim().toLowerCase();
    if (name) out.add(name);
  }
}

/** `close`, `keep-alive` or `upgrade` alone: names nothing that is not already hop-by-hop. */
function plainConnection(value: string): boolean {
  const v = value.length < 16 ? value.trim().toLowerCase() : '';
  return v === 'keep-alive' || v === 'close' || v === 'upgrade';
}

/** By name length: may this name be one the request rules look at? Others are passed without lower-casing. */
const REQUEST_LENGTHS = byLength([...HOP_BY_HOP, ...FORWARDED, 'host', 'authorization']);
const RESPONSE_LENGTHS = byLength([...HOP_BY_HOP, ...RESPONSE_DROP]);

function byLength(names: readonly string[]): boolean[] {
  const out: boolean[] = [];
  for (const n of names) out[n.length] = true;
  return out;
}

/** The headers sent to the replica: a flat [name, value, …] list in the client's order. */
export function upstreamRequestHeaders(raw: readonly string[], ctx: ForwardContext): string[] {
  // Headers named in Connection are dropped too; the set is built only when one names any.
  let listed: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 10 && name.toLowerCase() === 'connection' && !plainConnection(raw[i + 1]!))
      addConnectionTokens(raw[i + 1]!, (listed ??= new Set()));
  }
  const out: string[] = [];
  let priorXff: string | undefined;
  let host = '';
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const value = raw[i + 1]!;
    if (listed === null && REQUEST_LENGTHS[name.length] !== true) {
      out.push(name, value);
      continue;
    }
    const lower = name.toLowerCase();
    if (lower === 'host') host = value;
    else if (lower === 'x-forwarded-for') {
      priorXff = priorXff === undefined ? value : `${priorXff}, ${value}`;
      continue;
    }
    if (HOP_BY_HOP.has(lower) || FORWARDED.has(lower) || (listed !== null && listed.has(lower))) {
      if (ctx.upgrade && lower === 'upgrade') out.push(name, value);
      continue;
    }
    if (ctx.dropAuthorization && lower === 'authorization') continue;
    out.push(name, value);
  }
  if (ctx.upgrade) out.push('Connection', 'Upgrade');
  out.push(
    'X-Forwarded-For',
    priorXff === undefined ? ctx.clientIp : `${priorXff}, ${ctx.clientIp}`,
    'X-Forwarded-Proto',
    ctx.proto,
    'X-Real-IP',
    ctx.clientIp,
  );
  if (host) out.push('X-Forwarded-Host', host);
  return out;
}

/** downstreamResponseHeaders over the replica's raw [name, value, …] list (no header object built). */
export function downstreamRawHeaders(raw: readonly string[]): string[] {
  const out: string[] = [];
  let listed: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (RESPONSE_LENGTHS[name.length] !== true) {
      out.push(name, raw[i + 1]!);
      continue;
    }
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || RESPONSE_DROP.has(lower)) {
      if (lower === 'connection') {
        const v = raw[i + 1]!;
        if (!plainConnection(v)) addConnectionTokens(v, (listed ??= new Set()));
      }
      continue;
    }
    out.push(name, raw[i + 1]!);
  }
  if (listed === null) return out;
  const kept: string[] = [];
  for (let i = 0; i < out.length; i += 2) if (!listed.has(out[i]!.toLowerCase())) kept.push(out[i]!, out[i + 1]!);
  return kept;
}

/** The replica's response headers as sent to the client: a flat [name, value, …] list. */
export function downstreamResponseHeaders(headers: Record<string, string | string[] | undefined>): string[] {
  const listed = new Set<string>();
  const conn = headers.connection;
  for (const v of Array.isArray(conn) ? conn : conn ? [conn] : []) {
    for (const t of v.split(',')) listed.add(t.trim().toLowerCase());
  }
  const out: string[] = [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || listed.has(lower) || RESPONSE_DROP.has(lower)) continue;
    if (Array.isArray(value)) for (const v of value) out.push(name, v);
    else out.push(name, value);
  }
  return out;
}

/** `ip` without the IPv4-mapped prefix (`::ffff:127.0.0.1` → `127.0.0.1`). */
export function plainIp(ip: string | undefined): string {
  if (!ip) return '';
  return ip.startsWith('::ffff:') && ip.includes('.') ? ip.slice(7) : ip;
}
