// An in-process gateway for end-to-end tests: tmp state dir, free ports on 127.0.0.1, the real
// private Nginx. Plus a small HTTP client for the API and for the data path (Host header, body).

import { readdir, stat } from 'node:fs/promises';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { join, relative } from 'node:path';
import { startGateway, type Gateway, type GatewayDeps } from '../../src/daemon/gateway.js';
import { resolveOptions } from '../../src/gateway/options.js';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { freePorts } from './ports.js';
import { tmpDir } from './tmp.js';

export interface TestGateway {
  gw: Gateway;
  stateDir: string;
  apiPort: number;
  httpPort: number;
  httpsPort: number;
  /** Stop the gateway (and its Nginx). Idempotent. */
  close(): Promise<void>;
  /** close() and remove the state dir. */
  cleanup(): Promise<void>;
}

export interface TestGatewayOptions {
  /** Reuse a state dir (restart tests); default a new tmp dir. */
  stateDir?: string;
  /** Reuse ports (restart tests); default new free ports. */
  ports?: { apiPort: number; httpPort: number; httpsPort: number };
  /** '0' lets the kernel pick the API port. */
  apiPort0?: boolean;
  /** Seconds; default 3600 (no periodic pass during a test unless asked for). */
  resyncInterval?: number;
  apiTokenFile?: string;
  deps?: GatewayDeps;
}

export async function startTestGateway(o: TestGatewayOptions = {}): Promise<TestGateway> {
  const tmp = o.stateDir ? undefined : tmpDir('dp-e2e-');
  const stateDir = o.stateDir ?? join(tmp!.dir, 'state');
  const [apiPort, httpPort, httpsPort] = o.ports
    ? [o.ports.apiPort, o.ports.httpPort, o.ports.httpsPort]
    : ((await freePorts(3)) as [number, number, number]);
  const flags: Record<string, string> = {
    stateDir,
    apiPort: o.apiPort0 ? '0' : String(apiPort),
    httpPort: String(httpPort),
    httpsPort: String(httpsPort),
    listenHost: '127.0.0.1',
    logLevel: 'silent',
    resyncInterval: String(o.resyncInterval ?? 3600),
  };
  if (o.apiTokenFile) flags.apiTokenFile = o.apiTokenFile;
  const gw = await startGateway(resolveOptions({ flags }), o.deps ?? {});
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => (closed ??= gw.close());
  return {
    gw,
    stateDir,
    apiPort: Number(new URL(gw.apiUrl).port),
    httpPort,
    httpsPort,
    close,
    cleanup: async () => {
      await close();
      tmp?.cleanup();
    },
  };
}

// ── documents ─────────────────────────────────────────────────────────────────────────────

export interface SvcInput {
  run: string;
  project?: string;
  domain?: string;
  auth?: boolean;
  https?: boolean;
  clientMaxBodySize?: number;
  rateLimits?: { prefix: string; key: { type: 'ipAddress' } | { type: 'header'; header: string }; rps: number; burst?: number }[];
  /** Ports of direct replicas on 127.0.0.1. */
  ports?: number[];
}

export const GW_DOMAIN = 'gw.test';

/** A document of `main` (optionally with an SSH key) and plain-HTTP services with direct replicas. */
export function gatewayDoc(services: SvcInput[], opts: { sshPrivateKey?: string; extraProjects?: string[] } = {}): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      projects: [
        { name: 'main', ...(opts.sshPrivateKey ? { sshPrivateKey: opts.sshPrivateKey } : {}) },
        ...(opts.extraProjects ?? []).map((name) => ({ name })),
      ],
      services: services.map((s) => ({
        project: s.project ?? 'main',
        run: s.run,
        domain: s.domain ?? `${s.run}.${GW_DOMAIN}`,
        https: s.https ?? false,
        auth: s.auth ?? false,
        ...(s.clientMaxBodySize !== undefined ? { clientMaxBodySize: s.clientMaxBodySize } : {}),
        ...(s.rateLimits ? { rateLimits: s.rateLimits } : {}),
        replicas: (s.ports ?? []).map((port, i) => ({
          id: `${s.run}-r${i}`,
          appPort: port,
          direct: { host: '127.0.0.1', port },
        })),
      })),
    },
  };
}

// ── HTTP ──────────────────────────────────────────────────────────────────────────────────

export interface HttpReply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

export interface SendOptions {
  port: number;
  method?: string;
  path?: string;
  /** Host header; default 127.0.0.1. */
  host?: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
}

/**
 * One HTTP/1.1 request on its own connection. Resolves with the response even when the server
 * answers (413) and closes before the whole body was sent.
 */
export function send(o: SendOptions): Promise<HttpReply> {
  return new Promise((resolve, reject) => {
    const body = o.body === undefined ? undefined : Buffer.isBuffer(o.body) ? o.body : Buffer.from(o.body);
    const req = httpRequest({
      host: '127.0.0.1',
      port: o.port,
      method: o.method ?? 'GET',
      path: o.path ?? '/',
      agent: false,
      headers: {
        host: o.host ?? '127.0.0.1',
        ...(body ? { 'content-length': String(body.length) } : {}),
        ...o.headers,
      },
    });
    let responded = false;
    req.on('response', (res) => {
      responded = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', (err) => {
      if (!responded) reject(err);
    });
    if (body) req.write(body, () => undefined);
    req.end();
  });
}

export interface ApiCall {
  method?: string;
  path: string;
  body?: unknown;
  contentType?: string;
  token?: string;
  headers?: Record<string, string>;
}

/** Call the gateway API; a non-string body is sent as JSON. */
export async function api(t: { apiPort: number }, c: ApiCall): Promise<HttpReply & { json: unknown }> {
  const body = c.body === undefined ? undefined : typeof c.body === 'string' ? c.body : JSON.stringify(c.body);
  const r = await send({
    port: t.apiPort,
    method: c.method ?? 'GET',
    path: c.path,
    headers: {
      ...(body !== undefined ? { 'content-type': c.contentType ?? 'application/json' } : {}),
      ...(c.token ? { authorization: `Bearer ${c.token}` } : {}),
      ...c.headers,
    },
    ...(body !== undefined ? { body } : {}),
  });
  let json: unknown;
  try {
    json = JSON.parse(r.body);
  } catch {
    json = undefined;
  }
  return { ...r, json };
}

/** PUT /api/v1/state and wait until the controller has acted on the new generation. */
export async function putState(
  t: TestGateway,
  doc: unknown,
  opts: { dryRun?: boolean; ifMatch?: string; contentType?: string; token?: string } = {},
): Promise<HttpReply & { json: PutReply }> {
  const r = await api(t, {
    method: 'PUT',
    path: `/api/v1/state${opts.dryRun ? '?dryRun=true' : ''}`,
    body: doc,
    ...(opts.contentType ? { contentType: opts.contentType } : {}),
    ...(opts.token ? { token: opts.token } : {}),
    ...(opts.ifMatch !== undefined ? { headers: { 'if-match': opts.ifMatch } } : {}),
  });
  await t.gw.controller.whenIdle();
  return r as HttpReply & { json: PutReply };
}

export interface PutReply {
  generation: number;
  hash: string;
  changed: boolean;
  dryRun?: boolean;
  plan: {
    document: {
      changes: { kind: string; key: string; op: string; fields?: { field: string; old?: unknown; new?: unknown; secret?: true }[] }[];
    };
    loops: Record<string, { actions: { key: string; kind: string; summary: string; diff?: string }[]; notes?: Record<string, unknown> }>;
  };
  code?: string;
  errors?: { path: string; message: string }[];
}

// ── files ─────────────────────────────────────────────────────────────────────────────────

export interface FileStamp {
  ino: number;
  mtimeMs: number;
  size: number;
}

/** Every regular file under `dir` (recursive), by relative path, with inode and mtime. */
export async function stampTree(dir: string): Promise<Map<string, FileStamp>> {
  const out = new Map<string, FileStamp>();
  const walk = async (d: string): Promise<void> => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) {
        const s = await stat(p);
        out.set(relative(dir, p), { ino: s.ino, mtimeMs: s.mtimeMs, size: s.size });
      }
    }
  };
  await walk(dir);
  return out;
}

/** Names whose stamp differs, appeared or disappeared between two trees. */
export function changedFiles(before: Map<string, FileStamp>, after: Map<string, FileStamp>): string[] {
  const names = new Set([...before.keys(), ...after.keys()]);
  const out: string[] = [];
  for (const n of names) {
    const a = before.get(n);
    const b = after.get(n);
    if (!a || !b || a.ino !== b.ino || a.mtimeMs !== b.mtimeMs || a.size !== b.size) out.push(n);
  }
  return out.sort();
}

export function siteFile(t: TestGateway, domain: string): string {
  return join(t.gw.paths.confDir, 'sites', `${domain}.conf`);
}

/**
 * Wait until Nginx serves `domain`'s site: the Nginx loop reports it Applied, which it does once
 * the reload that brought the site in has no worker of the previous config accepting any more.
 * A request answered 200 says less: during a reload, old workers (without the site) still take
 * some of the new connections.
 */
export async function siteServed(t: TestGateway, domain: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ready = t.gw.controller.statuses().loops.nginx?.objects[domain]?.conditions.find((c) => c.type === 'Ready');
    if (ready?.status === 'True' && ready.reason === 'Applied') return;
    if (Date.now() > deadline) throw new Error(`${domain} not served by Nginx within ${timeoutMs} ms: ${JSON.stringify(ready ?? null)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
