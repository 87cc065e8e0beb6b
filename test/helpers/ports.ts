// Free TCP ports on 127.0.0.1, chosen by the kernel (listen on 0, read the port, close).

import { createServer } from 'node:net';

export async function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', reject);
    srv.listen(0, host, () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

/** n distinct free ports (held open together so the kernel can't hand out one twice). */
export async function freePorts(n: number, host = '127.0.0.1'): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<import('node:net').Server>((resolve, reject) => {
          const srv = createServer();
          srv.once('error', reject);
          srv.listen(0, host, () => resolve(srv));
        }),
    ),
  );
  const ports = servers.map((s) => {
    const a = s.address();
    return typeof a === 'object' && a ? a.port : 0;
  });
  await Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  return ports;
}
