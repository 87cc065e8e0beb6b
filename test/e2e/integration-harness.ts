// Shared pieces of the gateway integration suites (test/e2e/gateway-integration-*.test.ts):
// startGateway() with any extra option (server URL, ACME CA bundle …), a fastify app playing the
// control server, documents with SSH replicas, models and entrypoints, an HTTP(S) client that can
// send from another loopback address, and readers for /api/stats/collect and /metrics.

import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import Fastify from 'fastify';
import { startGateway, type GatewayDeps } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { api, type TestGateway } from '../helpers/gateway.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

// ── the gateway ───────────────────────────────────────────────────────────────────────────

/** A gateway on free 127.0.0.1 ports with its private Nginx; `flags` are gateway options by name. */
export async function startGatewayWith(flags: Record<string, string> = {}, deps: GatewayDeps = {}): Promise<TestGateway> {
  const tmp = tmpDir('dp-int-');
  const stateDir = join(tmp.dir, 'state');
  const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
  const options = resolveOptions({
    flags: {
      stateDir,
      apiPort: String(apiPort),
      httpPort: String(httpPort),
      httpsPort: String(httpsPort),
      listenHost: '127.0.0.1',
      logLevel: 'silent',
      resyncInterval: '3600',
      ...flags,
    },
  });
  const gw = await startGateway(options, deps).catch((err: unknown) => {
    tmp.cleanup();
    throw err;
  });
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => (closed ??= gw.close());
  return {
    gw,
    stateDir,
    apiPort,
    httpPort,
    httpsPort,
    close,
    cleanup: async () => {
      await close();
      tmp.cleanup();
    },
  };
}

// ── the control server ────────────────────────────────────────────────────────────────────

export interface ControlServer {
  url: string;
  /** Every token check it answered: project and the token it was asked about. */
  calls: { project: string; token: string }[];
  close(): Promise<void>;
}

/** dstack's `POST /api/projects/:project/get`: 200 for a member's token, 403 otherwise. */
export async function startControlServer(members: Record<string, string[]>): Promise<ControlServer> {
  const app = Fastify();
  const calls: ControlServer['calls'] = [];
  app.post<{ Params: { project: string } }>('/api/projects/:project/get', async (req, reply) => {
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
    calls.push({ project: req.params.project, token });
    if (members[req.params.project]?.includes(token)) return reply.code(200).send({ project_name: req.params.project });
    return reply.code(403).send({ detail: [{ msg: 'Access denied' }] });
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, calls, close: () => app.close() };
}

// ── documents ─────────────────────────────────────────────────────────────────────────────

export interface SshEndpoint {
  host: string;
  port: number;
  user: string;
}

export type ReplicaDoc =
  { id: string; appPort: number; ssh: SshEndpoint } | { id: string; appPort: number; direct: { host: string; port: number } };

export interface ServiceDoc {
  run: string;
  domain: string;
  project?: string;
  https?: boolean;
  auth?: boolean;
  model?: { name: string; format: 'openai'; prefix?: string };
  replicas: ReplicaDoc[];
}

export interface DocInput {
  acmeServer?: string;
  sshPrivateKey?: string;
  services: ServiceDoc[];
  entrypoints?: { project?: string; domain: string; https?: boolean }[];
}

export function directReplica(id: string, port: number): ReplicaDoc {
  return { id, appPort: port, direct: { host: '127.0.0.1', port } };
}

/** A document of project `main` with the given services and entrypoints. */
export function integrationDoc(d: DocInput): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      ...(d.acmeServer ? { acme: { server: d.acmeServer } } : {}),
      projects: [{ name: 'main', ...(d.sshPrivateKey ? { sshPrivateKey: d.sshPrivateKey } : {}) }],
      services: d.services.map((s) => ({
        project: s.project ?? 'main',
        run: s.run,
        domain: s.domain,
        https: s.https ?? false,
        auth: s.auth ?? false,
        ...(s.model ? { model: s.model } : {}),
        replicas: s.replicas,
      })),
      entrypoints: (d.entrypoints ?? []).map((e) => ({ project: e.project ?? 'main', domain: e.domain, https: e.https ?? false })),
    },
  };
}

// ── HTTP through Nginx ────────────────────────────────────────────────────────────────────

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

export interface CallOptions {
  port: number;
  /** Host header (and TLS server name). */
  host: string;
  path?: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  /** Source address, e.g. 127.0.0.2: another client address for Nginx's per-address limits. */
  localAddress?: string;
  /** PEM CA for HTTPS; without it the request is plain HTTP. */
  ca?: string;
}

/** One request on its own connection to 127.0.0.1. */
export function call(o: CallOptions): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const body = o.body === undefined ? undefined : Buffer.from(o.body);
    const common = {
      host: '127.0.0.1',
      port: o.port,
      path: o.path ?? '/',
      method: o.method ?? 'GET',
      headers: { host: o.host, ...(body ? { 'content-length': String(body.length) } : {}), ...o.headers },
      agent: false as const,
      ...(o.localAddress ? { localAddress: o.localAddress } : {}),
    };
    const req = o.ca ? httpsRequest({ ...common, servername: o.host, ca: o.ca }) : httpRequest(common);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

// ── stats and metrics ─────────────────────────────────────────────────────────────────────

interface CollectRow {
  project_name: string;
  run_name: string;
  stats: Record<string, { requests: number; request_time: number }>;
}

/** Requests of one service in the 30 s window of /api/stats/collect (0 when not listed). */
export async function requestsIn30s(t: TestGateway, project: string, run: string): Promise<number> {
  const r = await api(t, { path: '/api/stats/collect' });
  if (r.status !== 200) throw new Error(`/api/stats/collect answered ${r.status}: ${r.body}`);
  const row = (r.json as CollectRow[]).find((s) => s.project_name === project && s.run_name === run);
  return row?.stats['30']?.requests ?? 0;
}

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const SAMPLE_RE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$/;
const LABEL_RE = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Parses the Prometheus text format; throws on a line that is neither a comment nor a sample. */
export function parsePrometheus(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = SAMPLE_RE.exec(line);
    if (!m) throw new Error(`not a Prometheus sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL_RE)) labels[l[1]!] = l[2]!;
    const value = Number(m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : m[3]);
    // prom-client writes NaN as `Nan` (an event-loop lag mean before its first sample);
    // Prometheus reads NaN in any case, as Go's ParseFloat does.
    if (Number.isNaN(value) && m[3]?.toLowerCase() !== 'nan') throw new Error(`bad sample value in: ${line}`);
    out.push({ name: m[1]!, labels, value });
  }
  return out;
}

/** GET /metrics, parsed. */
export async function scrape(t: TestGateway): Promise<Sample[]> {
  const r = await api(t, { path: '/metrics' });
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  if (!String(r.headers['content-type']).startsWith('text/plain'))
    throw new Error(`/metrics content-type ${String(r.headers['content-type'])}`);
  return parsePrometheus(r.body);
}

export function sampleValue(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  return samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;
}
