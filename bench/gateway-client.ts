// The client side of the gateway benchmark, in its own process as it would be on other
// machines: the backend every replica points at, and the P3 client that PUTs the document and
// then checks every host through Nginx. The gateway's process then does only the gateway's
// work (in one process, the checkers' polling and the backend took as much CPU as the
// converge itself). Driven over IPC by bench/gateway.ts:
//   ← { backendPort }                           once the backend listens
//   → { converge: ConvergeRequest }             ← { convergeMs } once every host answered 200
//   → 'stop'                                    (exits)

import http from 'node:http';
import type net from 'node:net';

export interface ConvergeRequest {
  apiUrl: string;
  httpPort: number;
  doc: unknown;
  hosts: string[];
}

/** Checkers polling in parallel, each on its own keep-alive connection. */
const CHECKERS = 16;
/** Pause before asking a host again that did not answer 200 yet. */
const RETRY_MS = 5;

function send(msg: unknown): void {
  process.send?.(msg);
}

function get(port: number, host: string, agent: http.Agent): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
  });
}

/** PUT → every host answers 200 through Nginx, in ms. */
async function converge(r: ConvergeRequest): Promise<number> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CHECKERS });
  try {
    const t0 = performance.now();
    const res = await fetch(`${r.apiUrl}/api/v1/state`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(r.doc) });
    const body = await res.text();
    if (!res.ok) throw new Error(`PUT failed: ${body.slice(0, 300)}`);
    let next = 0;
    await Promise.all(
      Array.from({ length: CHECKERS }, async () => {
        while (next < r.hosts.length) {
          const host = r.hosts[next++]!;
          while ((await get(r.httpPort, host, agent)) !== 200) await new Promise((w) => setTimeout(w, RETRY_MS));
        }
      }),
    );
    return performance.now() - t0;
  } finally {
    agent.destroy();
  }
}

const backend = http.createServer((_req, res) => res.end('ok')).listen(0, '127.0.0.1', () => {
  send({ backendPort: (backend.address() as net.AddressInfo).port });
});

process.on('message', (msg) => {
  if (msg === 'stop') {
    backend.close();
    process.exit(0);
  }
  const m = msg as { converge?: ConvergeRequest };
  if (!m.converge) return;
  converge(m.converge).then(
    (convergeMs) => send({ convergeMs }),
    (err: unknown) => send({ error: err instanceof Error ? err.message : String(err) }),
  );
});
