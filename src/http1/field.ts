// Pieces of header-field parsing (RFC 9110 §5) shared by the response parser (parser.ts), the
// in-server proxy's request-head parser (server-proxy/raw/request-head.ts) and the model API's
// response adapter: small enough for V8 to inline into their loops.

/** SP or HTAB: optional whitespace around a field value. */
export function isOws(c: number): boolean {
  return c === 0x20 || c === 0x09;
}

/** The value of the field line `text[colon + 1 … eol)`, without the OWS around it. */
export function fieldValue(text: string, colon: number, eol: number): string {
  let vs = colon + 1;
  let ve = eol;
  while (vs < ve && isOws(text.charCodeAt(vs))) vs++;
  while (ve > vs && isOws(text.charCodeAt(ve - 1))) ve--;
  return text.slice(vs, ve);
}

/**
 * `s` from `at` equals `lower` (lower-case letters, digits and '-') ignoring ASCII case; the
 * length is the caller's to check. `| 0x20` maps only A–Z onto a–z here: CR, the only other byte
 * that would become '-', never reaches a name or a value.
 */
export function sameLower(s: string, at: number, lower: string): boolean {
  for (let i = 0; i < lower.length; i++) if ((s.charCodeAt(at + i) | 0x20) !== lower.charCodeAt(i)) return false;
  return true;
}

/** More than one Host field line in a raw `[name, value, …]` list (RFC 9112 §3.2: answer 400). */
export function hasDuplicateHost(raw: readonly string[]): boolean {
  let seen = false;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && sameLower(name, 0, 'host')) {
      if (seen) return true;
      seen = true;
    }
  }
  return false;
}

/** Lower-case names; repeated headers joined with ', ' (set-cookie kept as a list). */
export function headerObject(raw: readonly string[]): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = Object.create(null) as Record<string, string | string[]>;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    const value = raw[i + 1]!;
    const prev = out[name];
    if (prev === undefined) out[name] = name === 'set-cookie' ? [value] : value;
    else if (Array.isArray(prev)) prev.push(value);
    else out[name] = `${prev}, ${value}`;
  }
  return out;
}
