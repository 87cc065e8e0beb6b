// dstack's error answer: a status and `{"detail": "<text>"}` as application/json. Written to an
// HTTP response (Node's, or the raw fast path's), or, for an upgrade, which has left Node's HTTP
// server, as a whole HTTP/1.1 response straight onto the socket.

import type { IncomingHttpHeaders } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';

export function detailBody(detail: string): string {
  return JSON.stringify({ detail });
}

/** The request declares a body: any Transfer-Encoding, or a Content-Length other than 0. */
export function hasBody(req: { readonly headers: IncomingHttpHeaders }): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

/** What sendDetail uses of a response (Node's ServerResponse, or the raw path's). */
interface DetailResponse {
  readonly headersSent: boolean;
  writeHead(status: number, headers: Record<string, string | number>): unknown;
  end(chunk: string): unknown;
  destroy(): unknown;
}

/** A JSON `{detail}` answer. An unread request body is not drained: the connection closes. */
export function sendDetail(
  req: { readonly headers: IncomingHttpHeaders; readonly readableEnded: boolean },
  res: DetailResponse,
  status: number,
  detail: string,
  extra: Record<string, string> = {},
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = detailBody(detail);
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    ...extra,
  };
  if (hasBody(req) && !req.readableEnded) headers.connection = 'close';
  res.writeHead(status, headers);
  res.end(body);
}

/** How long a refused upgrade's socket stays open after the answer is flushed, for the client to read it. */
const REFUSED_LINGER_MS = 1_000;

/** A whole response written onto a socket outside Node's HTTP server; the connection then closes. */
export function rawReply(socket: Duplex, status: number, headers: Record<string, string>, body = ''): void {
  // An upgraded socket has left Node's server and its error listener: a client resetting it while
  // the answer is written must not become an uncaught 'error'.
  socket.on('error', () => socket.destroy());
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Unknown'}`];
  for (const [k, v] of Object.entries({ ...headers, 'Content-Length': String(Buffer.byteLength(body)), Connection: 'close' }))
    lines.push(`${k}: ${v}`);
  // Upgrade sockets are half-open capable: do not wait for the client to hang up.
  socket.end(`${lines.join('\r\n')}\r\n\r\n${body}`, () => setTimeout(() => socket.destroy(), REFUSED_LINGER_MS).unref());
}

/** rawReply with a `{detail}` body. */
export function rawDetail(socket: Duplex, status: number, detail: string): void {
  rawReply(socket, status, { 'Content-Type': 'application/json' }, detailBody(detail));
}

/**
 * A whole `{detail}` answer as HTTP/1.1 text, for a relay writing straight onto its socket (the
 * balancer behind Nginx). `keepAlive` false says Connection: close; the caller then closes.
 */
export function detailResponse(status: number, detail: string, keepAlive: boolean): string {
  const body = detailBody(detail);
  return (
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Unknown'}\r\n` +
    'Content-Type: application/json\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    (keepAlive ? '\r\n' : 'Connection: close\r\n\r\n') +
    body
  );
}
