// The bearer token of a request, as the management API, the auth target and the data plane read it.

/** The token of an `Authorization: Bearer <token>` header, or null when absent or malformed. */
export function bearerToken(header: string | string[] | undefined): string | null {
  if (typeof header !== 'string') return null;
  const m = /^Bearer[ \t]+([\x21-\x7e]+)[ \t]*$/i.exec(header);
  return m?.[1] ?? null;
}
