// A replica scripted on raw TCP, for answers no HTTP library would send: each request head
// (a Content-Length body is skipped) goes to `onRequest` with its 0-based number on the connection.

import { createServer, type Server, type Socket } from 'node:net';

export type Script = (socket: Socket, nth: number, head: string) => void;

export async function startScriptedReplica(onRequest: Script): Promise<{ server: Server; port: number }> {
  const server = createServer((socket) => {
    let nth = 0;
    let buf = '';
    socket.on('error', () => undefined);
    socket.on('data', (d) => {
      buf += d.toString('latin1');
      let end: number;
      while ((end = buf.indexOf('\r\n\r\n')) !== -1) {
        const head = buf.slice(0, end);
        const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + length) break;
        buf = buf.slice(end + 4 + length);
        onRequest(socket, nth++, head);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as { port: number }).port };
}
