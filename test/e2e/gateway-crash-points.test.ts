// A gateway killed with SIGKILL at 20 random points while it converges a 300-service document
// (store write, renders, nginx -t of the candidate tree, swaps, reload), restarted each time.
// After every restart: state.json holds the last acknowledged generation (or the one whose PUT
// was cut off, committed but unanswered), the conf dir holds exactly the stored document's
// files, each whole, and nothing else. After the last one, Nginx serves the whole document.
// The kill points come from a seeded generator: DP_CRASH_SEED=<n> replays a run.

import { readFile, readdir } from 'node:fs/promises';
import { request as httpRequest, type Server } from 'node:http';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { GLOBAL_FILE, MARKER, SITES_SUBDIR } from '../../src/reconcilers/nginx/names.js';
import { startCliGateway, type CliGateway } from '../helpers/cli-gateway.js';
import { gatewayDoc, type SvcInput } from '../helpers/gateway.js';
import { request, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';
import { prng } from '../helpers/prng.js';

const ROUNDS = 20;
const SERVICES = 300;
/**
 * Kills land uniformly within this long after the PUT was sent: a 300-service converge (store
 * write, render, nginx -t, swap, reload) takes about as long here.
 */
const MAX_DELAY_MS = 800;
/** The gateway reloads at most once per second: a PUT this long after a start goes in at once. */
const QUIET_MS = 1_100;

/** Round k's document: 250 fixed services and 50 that change name every round; every site's body limit moves. */
function roundDoc(k: number, port: number): { doc: Record<string, unknown>; domains: string[]; bodySize: number } {
  const bodySize = 1_000_000 + k;
  const services: SvcInput[] = [];
  for (let j = 0; j < SERVICES; j++)
    services.push({ run: j < 250 ? `svc-${j}` : `r${k}-${j}`, ports: [port], clientMaxBodySize: bodySize });
  return { doc: gatewayDoc(services), domains: services.map((s) => `${s.run}.gw.test`), bodySize };
}

/** PUT without waiting for anything else; resolves with the reply, or null when the gateway died first. */
function putRaw(apiPort: number, doc: unknown): Promise<{ status: number; generation: number } | null> {
  return new Promise((resolve) => {
    const body = Buffer.from(JSON.stringify(doc));
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: apiPort,
        method: 'PUT',
        path: '/api/v1/state',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(body.length) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          try {
            resolve({
              status: res.statusCode ?? 0,
              generation: (JSON.parse(Buffer.concat(chunks).toString()) as { generation: number }).generation,
            });
          } catch {
            resolve(null);
          }
        });
        res.on('error', () => resolve(null));
      },
    );
    req.on('error', () => resolve(null));
    req.end(body);
  });
}

interface Stored {
  generation: number;
  bodySize: number;
  domains: string[];
}

async function readStored(stateDir: string): Promise<Stored> {
  // A kill before the first document was stored leaves a fresh state dir: generation 0, nothing.
  const text = await readFile(join(stateDir, 'state.json'), 'utf8').catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw err;
  });
  if (text === null) return { generation: 0, bodySize: 0, domains: [] };
  const doc = JSON.parse(text) as {
    metadata: { generation: number };
    spec: { services: { domain: string; clientMaxBodySize?: number }[] };
  };
  return {
    generation: doc.metadata.generation,
    bodySize: doc.spec.services[0]?.clientMaxBodySize ?? 0,
    domains: doc.spec.services.map((s) => s.domain).sort(),
  };
}

/** Problems with the conf dir against the stored document: missing, extra, foreign or partial files. */
async function confDirProblems(confDir: string, stored: Stored): Promise<string[]> {
  const problems: string[] = [];
  const top = await readdir(confDir, { withFileTypes: true });
  for (const e of top) {
    if (e.isDirectory() && e.name === SITES_SUBDIR) continue;
    if (!(e.isFile() && e.name === GLOBAL_FILE)) problems.push(`unexpected ${e.name} in the conf dir`);
  }
  const sites = (await readdir(join(confDir, SITES_SUBDIR))).sort();
  const want = stored.domains.map((d) => `${d}.conf`).sort();
  const missing = want.filter((n) => !sites.includes(n));
  const extra = sites.filter((n) => !want.includes(n));
  if (missing.length > 0) problems.push(`missing ${missing.length} site files, e.g. ${missing[0]}`);
  if (extra.length > 0) problems.push(`${extra.length} files not in the document, e.g. ${extra[0]}`);
  for (const name of sites.filter((n) => want.includes(n))) {
    const text = await readFile(join(confDir, SITES_SUBDIR, name), 'utf8');
    if (!text.startsWith(`${MARKER}\n`) || !text.endsWith('}\n')) problems.push(`${name} is not a whole site file`);
    else if (!text.includes(`client_max_body_size ${stored.bodySize};`)) problems.push(`${name} is from another generation`);
  }
  // Candidate trees of an interrupted nginx -t live next to the conf dir.
  for (const name of await readdir(join(confDir, '..'))) {
    if (name.includes('candidate')) problems.push(`leftover ${name} next to the conf dir`);
  }
  return problems.slice(0, 10);
}

/** What the kill interrupted, as the conf dir shows it (for the log only). */
async function whereKilled(confDir: string, bodySize: number): Promise<string> {
  const candidate = (await readdir(join(confDir, '..'))).some((n) => n.includes('candidate'));
  const temps = (await readdir(join(confDir, SITES_SUBDIR))).filter((n) => n.endsWith('.tmp')).length;
  let current = 0;
  for (const name of await readdir(join(confDir, SITES_SUBDIR))) {
    if (!name.endsWith('.conf')) continue;
    const text = await readFile(join(confDir, SITES_SUBDIR, name), 'utf8').catch(() => '');
    if (text.includes(`client_max_body_size ${bodySize};`)) current++;
  }
  return `${current} site files of this round${candidate ? ', a candidate tree' : ''}${temps ? `, ${temps} temp files` : ''} left`;
}

const tmp = tmpDir('dp-crashpts-');
let echo: Server | undefined;
let gw: CliGateway | undefined;
afterAll(async () => {
  await gw?.kill();
  // The last gateway's Nginx outlives its SIGKILL: a short-lived gateway on the same state dir
  // stops it (what a restart does) — here, by its pid file, after checking it is that Nginx.
  const pid = Number((await readFile(join(tmp.dir, 'state', 'nginx', 'nginx.pid'), 'utf8').catch(() => '')).trim());
  const title = pid > 0 ? await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '') : '';
  if (title.startsWith('nginx: master process') && title.includes(join(tmp.dir, 'state', 'nginx'))) process.kill(pid, 'SIGTERM');
  await new Promise<void>((r) => (echo ? echo.close(() => r()) : r()));
  tmp.cleanup();
});

describe('a gateway killed at random points of a 300-service converge', () => {
  it(`loses nothing over ${ROUNDS} SIGKILLs and serves the whole document after the last restart`, { timeout: 240_000 }, async () => {
    const seed = Number(process.env.DP_CRASH_SEED ?? Math.floor(Math.random() * 2 ** 31));
    console.log(`crash points: seed ${seed} (DP_CRASH_SEED=${seed} replays this run)`);
    const random = prng(seed);
    const stateDir = join(tmp.dir, 'state');
    const confDir = join(stateDir, 'nginx', 'conf.d');
    const [apiPort, httpPort, httpsPort, echoPort] = (await freePorts(4)) as [number, number, number, number];
    const ports = { apiPort, httpPort, httpsPort };
    echo = await startEcho('echo', { port: echoPort });

    gw = await startCliGateway(stateDir, ports);
    let acked = 0;
    const log: string[] = [];
    for (let k = 1; k <= ROUNDS; k++) {
      const { bodySize } = roundDoc(k, echoPort);
      const delay = Math.floor(random() * MAX_DELAY_MS);
      await new Promise((r) => setTimeout(r, QUIET_MS));
      const reply = putRaw(apiPort, roundDoc(k, echoPort).doc);
      await new Promise((r) => setTimeout(r, delay));
      await gw.kill();
      const answered = await reply;
      if (answered) {
        expect(answered.status).toBe(200);
        acked = answered.generation;
      }

      const seen = await whereKilled(confDir, bodySize);
      gw = await startCliGateway(stateDir, ports);
      const stored = await readStored(stateDir);
      // The acknowledged generation, or the next one: committed, cut off before its answer.
      if (stored.generation === acked + 1) expect(stored.bodySize).toBe(bodySize);
      else expect(stored.generation).toBe(acked);
      acked = stored.generation;
      expect(await confDirProblems(confDir, stored)).toEqual([]);
      log.push(`${k}: kill at ${delay} ms, ${answered ? 'answered' : 'no answer'}, ${seen}; generation ${stored.generation}`);
    }
    console.log(log.join('\n'));

    // After the last restart: every site of the stored document answers.
    const stored = await readStored(stateDir);
    expect(stored.domains.length).toBe(SERVICES);
    const t0 = Date.now();
    await eventually(async () => {
      for (const domain of stored.domains) {
        const r = await request({ port: httpPort, host: domain, localAddress: '127.0.0.2' });
        if (r.status !== 200) return undefined;
      }
      return true;
    }, 10_000);
    console.log(`all ${SERVICES} sites answered ${Date.now() - t0} ms after the last restart was ready`);
  });
});
