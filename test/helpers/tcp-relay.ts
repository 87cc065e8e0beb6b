// A plain TCP relay on 127.0.0.1 to another local port: what a TLS terminator, a load balancer
// agent or an `ssh -L` forward on the gateway host looks like to Nginx — every client it relays
// arrives from 127.0.0.1.

import { connect, createServer, type AddressInfo, type Socket } from 'node:net';

export interface TcpRelay {
  port: number;
  close(): Promise<void>;
}

export async function startTcpRelay(targetPort: number): Promise<TcpRelay> {
  const sockets = new Set<Socket>();
  const track = (s: Socket): Socket => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    return s;
  };
  const srv = createServer((client) => {
    track(client);
    const upstream = track(connect({ host: '127.0.0.1', port: targetPort, localAddress: '127.0.0.1' }));
    client.pipe(upstream);
    upstream.pipe(client);
    client.once('close', () => upstream.destroy());
    upstream.once('close', () => client.destroy());
  });
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', resolve);
  });
  return {
    port: (srv.address() as AddressInfo).port,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        srv.close(() => resolve());
      }),
  };
}
