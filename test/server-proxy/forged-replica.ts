// Forged replica answers (scripted on raw TCP) and a pipelining raw client, shared by the
// in-server proxy's and the gateway Nginx's forged-response tests.

import type { Socket } from 'node:net';
import { connect as netConnect } from 'node:net';

export const SMUGGLED = 'HTTP/1.1 200 OK\r\nX-Smuggled: yes\r\nContent-Length: 17\r\n\r\n{"smuggled":"yes"}';

/** Forged answers by name; `/evil/<name>` asks for one, anything else gets an honest answer. */
export const FORGED: Record<string, string> = {
  // The classic TE.CL payload: chunked framing says 'ok' + a whole fake response, the length says 2.
  'te-cl': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n${(2 + SMUGGLED.length).toString(16)}\r\nok${SMUGGLED}\r\n0\r\n\r\n`,
  'te-cl-long': 'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n',
  'two-cl': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: ${2 + SMUGGLED.length}\r\n\r\nok${SMUGGLED}`,
  'bad-chunk': `HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n${SMUGGLED}`,
  'longer-than-declared': `HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok${SMUGGLED}`,
};

/** Each request the replica got: its target and the connection it came on. */
export const seen: { target: string; conn: number }[] = [];
const connIds = new WeakMap<Socket, number>();
let conns = 0;

/** The replica's script: a forged answer for /evil/<name>, else 200 `real:<target>`. */
export function forgedOrReal(socket: Socket, _nth: number, head: string): void {
  const target = head.split(' ')[1] ?? '';
  if (!connIds.has(socket)) connIds.set(socket, ++conns);
  seen.push({ target, conn: connIds.get(socket)! });
  const name = /\/evil\/([\w-]+)/.exec(target)?.[1];
  if (name !== undefined && FORGED[name] !== undefined) return void socket.write(FORGED[name]);
  const body = `real:${target}`;
  socket.write(`HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
}

export interface Parsed {
  status: number;
  headers: [string, string][];
  body: string;
}

/** The responses in `text`, framed as a client would (Content-Length, else chunked); `rest` is what is left. */
export function parseResponses(text: string): { responses: Parsed[]; rest: string } {
  const responses: Parsed[] = [];
  let p = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', p);
    if (end === -1) break;
    const [line, ...lines] = text.slice(p, end).split('\r\n');
    const headers = lines.map((l): [string, string] => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]);
    const get = (n: string): string | undefined => headers.find(([k]) => k === n)?.[1];
    let q = end + 4;
    let body = '';
    if (get('content-length') !== undefined) {
      const n = Number(get('content-length'));
      if (text.length < q + n) break;
      body = text.slice(q, q + n);
      q += n;
    } else if (get('transfer-encoding') === 'chunked') {
      let complete = false;
      for (;;) {
        const eol = text.indexOf('\r\n', q);
        if (eol === -1) break;
        const n = parseInt(text.slice(q, eol), 16);
        if (text.length < eol + 2 + n + 2) break;
        body += text.slice(eol + 2, eol + 2 + n);
        q = eol + 2 + n + 2;
        if (n === 0) {
          complete = true;
          break;
        }
      }
      if (!complete) break;
    }
    responses.push({ status: Number(line!.split(' ')[1]), headers, body });
    p = q;
  }
  return { responses, rest: text.slice(p) };
}

/** Send `requests` in one write on one connection, read until it closes. */
export function pipelined(port: number, requests: string[]): Promise<string> {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    let text = '';
    s.on('data', (c: Buffer) => (text += c.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => resolve(text));
    s.write(requests.join(''));
  });
}
