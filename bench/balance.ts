// P5d: how the gateway spreads requests over a service's replicas, through its real Nginx and
// the balancer socket behind it (replicas are `direct`, HTTP servers in this process on 127.0.0.1).
//   a) two replicas, one answering in 1 s and one in 10 ms, 8 concurrent keep-alive clients for
//      10 s: the fast replica's share of the answers;
//   b) 1,000 sequential requests on one keep-alive client connection over 2 and over 4 replicas:
//      the busiest replica's count over the idlest one's.
// The baseline in the same run is Nginx round-robin straight to the same replicas (an upstream
// block with their ports, a private Nginx of its own): per-request but blind to load.

import http from 'node:http';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { eventually, startTestNginx } from '../test/helpers/nginx.js';
import { freePort, startBenchGateway } from './gateway.js';
import { generateDocument } from './generate.js';
import type { Row } from './table.js';

const SLOW_MS = 1000;
const FAST_MS = 10;
const CLIENTS = 8;
const SECONDS = 10;
const SEQUENTIAL = 1000;
/** dstack's gateway (Nginx round-robin per request) and the per-connection balancer this one replaced, measured by hand. */
const REFERENCE =
  "dstack's gateway splits sequential requests 100:100 per request (Nginx round-robin); the per-connection balancer this replaced gave a 2nd replica 0 of 200 sequential probes on one keep-alive connection";

interface Replica {
  id: string;
  port: number;
  server: http.Server;
}

async function startReplica(id: string, delayMs: number): Promise<Replica> {
  const server = http.createServer((req, res) => {
    req.resume();
    const answer = (): void => {
      res.setHeader('content-type', 'text/plain');
      res.end(id);
    };
    if (delayMs > 0) setTimeout(answer, delayMs);
    else answer();
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { id, port: (server.address() as net.AddressInfo).port, server };
}

/** One request on `agent`; the replica id that answered, or '' on an error or a non-200 answer. */
function get(port: number, host: string, agent: http.Agent | false): Promise<string> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', headers: { host }, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve(res.statusCode === 200 ? body : ''));
      res.on('error', () => resolve(''));
    });
    req.on('error', () => resolve(''));
  });
}

function tally(ids: string[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const id of ids) m.set(id, (m.get(id) ?? 0) + 1);
  return m;
}

/** `CLIENTS` keep-alive clients, each sending its next request when the last is answered, for `SECONDS`. */
async function concurrent(port: number, host: string): Promise<Map<string, number>> {
  const until = Date.now() + SECONDS * 1000;
  const answers: string[] = [];
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      try {
        while (Date.now() < until) answers.push(await get(port, host, agent));
      } finally {
        agent.destroy();
      }
    }),
  );
  return tally(answers);
}

/** `SEQUENTIAL` requests one after another on one keep-alive connection. */
async function sequential(port: number, host: string): Promise<Map<string, number>> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const answers: string[] = [];
  try {
    for (let i = 0; i < SEQUENTIAL; i++) answers.push(await get(port, host, agent));
  } finally {
    agent.destroy();
  }
  return tally(answers);
}

function counts(m: Map<string, number>, replicas: Replica[]): string {
  const failed = m.get('') ?? 0;
  return `${replicas.map((r) => `${r.id} ${m.get(r.id) ?? 0}`).join(', ')}${failed ? `, ${failed} failed` : ''}`;
}

function fastShare(m: Map<string, number>, fast: Replica, slow: Replica): number {
  const f = m.get(fast.id) ?? 0;
  const total = f + (m.get(slow.id) ?? 0);
  return total === 0 ? 0 : Math.round((1000 * f) / total) / 10;
}

/** max/min of the replicas' counts; a replica that got none counts as 1, so 1,000:0 reads 1,000. */
function spread(m: Map<string, number>, replicas: Replica[]): number {
  const c = replicas.map((r) => m.get(r.id) ?? 0);
  return Math.round((100 * Math.max(...c)) / Math.max(1, Math.min(...c))) / 100;
}

export async function balanceRows(): Promise<Row[]> {
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'dp-bench-bal-'));
  const slow = await startReplica('slow', SLOW_MS);
  const fast = await startReplica('fast', FAST_MS);
  const two = await Promise.all([0, 1].map((i) => startReplica(`two-${i}`, 0)));
  const four = await Promise.all([0, 1, 2, 3].map((i) => startReplica(`four-${i}`, 0)));
  const { gw, httpPort } = await startBenchGateway(stateDir);
  const rr = await startTestNginx();
  try {
    const groups = { slowfast: [slow, fast], two, four };
    const doc = generateDocument(3, 1, { direct: true });
    const services = doc.spec.services!;
    Object.entries(groups).forEach(([run, replicas], i) => {
      const s = services[i]!;
      Object.assign(s, { run, domain: `${run}.bal.example.com`, auth: false, rateLimits: [] });
      s.replicas = replicas.map((r) => ({ id: r.id, appPort: r.port, direct: { host: '127.0.0.1', port: r.port } }));
    });
    const r = await fetch(`${gw.apiUrl}/api/v1/state`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(doc),
    });
    if (!r.ok) throw new Error(`PUT failed: ${(await r.text()).slice(0, 300)}`);
    await gw.controller.whenIdle();

    // Nginx round-robin straight to the replicas: one server per group on a port of its own.
    const rrPorts = { slowfast: await freePort(), two: await freePort(), four: await freePort() };
    writeFileSync(
      path.join(rr.paths.confDir, 'sites', 'bench-rr.conf'),
      Object.entries(groups)
        .map(
          ([run, replicas]) => `
upstream rr_${run} { ${replicas.map((x) => `server 127.0.0.1:${x.port};`).join(' ')} keepalive 64; }
server { listen 127.0.0.1:${rrPorts[run as keyof typeof groups]}; location / { proxy_pass http://rr_${run}; proxy_http_version 1.1; proxy_set_header Connection ""; } }`,
        )
        .join('\n'),
    );
    await rr.reload();

    // Every replica answers through the gateway before anything is counted: new connections
    // (Connection: close) in parallel, until each replica of each group has been seen.
    for (const [run, replicas] of Object.entries(groups)) {
      const host = `${run}.bal.example.com`;
      const seen = new Set<string>();
      await eventually(async () => {
        const ids = await Promise.all(Array.from({ length: 8 }, () => get(httpPort, host, false)));
        for (const id of ids) if (id) seen.add(id);
        return replicas.every((x) => seen.has(x.id)) ? true : undefined;
      }, 30_000);
      await eventually(async () => ((await get(rrPorts[run as keyof typeof groups], host, false)) ? true : undefined), 10_000);
    }

    const rows: Row[] = [];
    const oursA = await concurrent(httpPort, 'slowfast.bal.example.com');
    const theirsA = await concurrent(rrPorts.slowfast, 'slowfast.bal.example.com');
    const a = fastShare(oursA, fast, slow);
    rows.push({
      id: 'P5d',
      name: `share of the fast replica (${FAST_MS} ms vs ${SLOW_MS} ms), ${CLIENTS} clients × ${SECONDS} s, per-request balancer`,
      value: a,
      unit: '%',
      target: '≥ 80 %',
      ok: a >= 80,
      better: 'higher',
      baseline: { name: 'Nginx round-robin to the replicas', value: fastShare(theirsA, fast, slow), measured: 'same run' },
      note: `answers ours: ${counts(oursA, [fast, slow])}; Nginx round-robin: ${counts(theirsA, [fast, slow])}`,
    });
    for (const [run, replicas] of [
      ['two', two],
      ['four', four],
    ] as const) {
      const host = `${run}.bal.example.com`;
      const ours = await sequential(httpPort, host);
      const theirs = await sequential(rrPorts[run], host);
      const s = spread(ours, replicas);
      rows.push({
        id: `P5d-${replicas.length}`,
        name: `${SEQUENTIAL.toLocaleString('en-US')} sequential requests, one keep-alive connection, ${replicas.length} replicas: max/min share`,
        value: s,
        unit: '×',
        target: '≤ 1.5',
        ok: s <= 1.5,
        better: 'lower',
        baseline: { name: 'Nginx round-robin to the replicas', value: spread(theirs, replicas), measured: 'same run' },
        note: `ours: ${counts(ours, replicas)}; Nginx round-robin: ${counts(theirs, replicas)}${replicas.length === 2 ? `; reference: ${REFERENCE}` : ''}`,
      });
    }
    return rows;
  } finally {
    await gw.close();
    await rr.stop();
    for (const x of [slow, fast, ...two, ...four]) x.server.close();
    for (const x of [slow, fast, ...two, ...four]) x.server.closeAllConnections();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

// Run alone: node dist/bench/balance.js
if (process.argv[1]?.endsWith('/bench/balance.js')) {
  balanceRows().then(
    (rows) => process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`),
    (err: unknown) => {
      process.stderr.write(`${String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
