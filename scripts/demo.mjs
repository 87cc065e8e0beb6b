#!/usr/bin/env node
// `npm start`: the gateway on examples/local-state.yaml, on one machine, no root paths.
//   - two tiny demo model servers on 127.0.0.1:18001 and :18002 (the example's replicas);
//   - `dstack-proxy gateway` with a private Nginx under ./.dstack-proxy on HTTP port 18080,
//     API on 127.0.0.1:18000;
//   - PUT of the example, then the curl line to try. Ctrl-C stops everything.
// Ports can be moved with DEMO_HTTP_PORT / DEMO_API_PORT, the state dir with DEMO_STATE_DIR.

import { spawn } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const httpPort = Number(process.env.DEMO_HTTP_PORT ?? 18080);
const apiPort = Number(process.env.DEMO_API_PORT ?? 18000);
const example = path.join(root, 'examples', 'local-state.yaml');
const stateDir = process.env.DEMO_STATE_DIR ?? path.join(root, '.dstack-proxy');

// Run as root, the private Nginx's workers are www-data, and they must be able to enter the
// dir that holds the balancer sockets (next to the state dir). A checkout under a 0700 home
// (/root) would stop the gateway at start; the demo then keeps that dir under /run instead,
// which only root can write.
function othersCanEnterParentsOf(dir) {
  for (let d = path.dirname(dir); ; d = path.dirname(d)) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return false;
    } catch {
      // not created yet: the gateway makes it, traversable
    }
    if (d === path.dirname(d)) return true;
  }
}
const workerDirArgs =
  process.getuid?.() === 0 && !process.env.DEMO_NGINX_WORKER_DIR && !othersCanEnterParentsOf(`${stateDir}-nginx`)
    ? ['--nginx-worker-dir', '/run/dstack-proxy-demo-nginx']
    : process.env.DEMO_NGINX_WORKER_DIR
      ? ['--nginx-worker-dir', process.env.DEMO_NGINX_WORKER_DIR]
      : [];

const replicas = [18001, 18002].map((port, i) =>
  http
    .createServer((req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(`${JSON.stringify({ replica: `hello-${i}`, method: req.method, path: req.url })}\n`);
    })
    .listen(port, '127.0.0.1'),
);

const gateway = spawn(
  process.execPath,
  [
    path.join(root, 'dist', 'src', 'cli.js'),
    'gateway',
    '--state-dir',
    stateDir,
    ...workerDirArgs,
    '--http-port',
    String(httpPort),
    '--https-port',
    String(httpPort + 363),
    '--listen-host',
    '127.0.0.1',
    '--api-port',
    String(apiPort),
    '--log-level',
    process.env.DEMO_LOG_LEVEL ?? 'warn',
  ],
  { stdio: ['ignore', 'inherit', 'inherit'] },
);

let stopping = false;
function stop(code) {
  if (stopping) return;
  stopping = true;
  for (const r of replicas) r.close();
  if (gateway.exitCode === null) gateway.kill('SIGTERM');
  gateway.once('exit', () => process.exit(code));
  setTimeout(() => process.exit(code), 10_000).unref();
}
process.on('SIGINT', () => stop(0));
process.on('SIGTERM', () => stop(0));
gateway.on('exit', (code) => {
  if (!stopping) {
    process.stderr.write(`demo: the gateway exited with code ${code}\n`);
    stop(code ?? 1);
  }
});

async function waitReady() {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`http://127.0.0.1:${apiPort}/readyz`);
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error('the gateway did not become ready within 30 s');
}

try {
  await waitReady();
  const put = await fetch(`http://127.0.0.1:${apiPort}/api/v1/state`, {
    method: 'PUT',
    headers: { 'content-type': 'application/yaml' },
    body: readFileSync(example, 'utf8'),
  });
  const body = await put.json();
  if (!put.ok) throw new Error(`PUT failed: ${JSON.stringify(body)}`);
  // Wait until the site answers (the Nginx loop converges right after the PUT).
  const deadline = Date.now() + 15_000;
  for (;;) {
    // fetch() may not set Host, so plain http.get.
    const status = await new Promise((resolve) => {
      http
        .get({ host: '127.0.0.1', port: httpPort, path: '/', headers: { host: 'hello.localhost' } }, (res) => {
          res.resume();
          resolve(res.statusCode);
        })
        .on('error', () => resolve(0));
    });
    if (status === 200) break;
    if (Date.now() > deadline) throw new Error('the example site did not come up within 15 s');
    await new Promise((res) => setTimeout(res, 200));
  }
  process.stdout.write(`
dstack-proxy is serving ${path.relative(root, example)} (generation ${body.generation}).

  curl -H 'Host: hello.localhost' http://127.0.0.1:${httpPort}/
  curl http://127.0.0.1:${apiPort}/api/v1/status
  node dist/src/cli.js plan -f examples/local-state.yaml --url http://127.0.0.1:${apiPort}

State, Nginx config and logs are under .dstack-proxy/. Ctrl-C stops the gateway and its Nginx.
`);
} catch (err) {
  process.stderr.write(`demo: ${err.message}\n`);
  stop(1);
}
