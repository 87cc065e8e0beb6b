// The standalone server proxy in-process (the same startServerProxy the CLI runs) over a
// SQLite file in a scratch directory, plus a raw HTTP client that sends exactly what it is given.

import type { Clock } from '../../src/clock.js';
import { fastify, type FastifyInstance } from 'fastify';
import { request as httpRequest, type Agent, type IncomingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import { pino } from 'pino';
import { registerServerProxy } from '../../src/server-proxy/plugin.js';
import {
  startServerProxy,
  type RunningServerProxy,
  type ServerProxyDeps,
  type ServerProxyServerOptions,
} from '../../src/daemon/server-proxy.js';
import { emptyState, type ProxyState, type Service } from '../../src/spec/types.js';
import { eventually } from '../helpers/nginx.js';
import { replicasOf, tcpUpstream } from '../helpers/replicas.js';
import { tmpDir } from '../helpers/tmp.js';

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  json<T = Record<string, unknown>>(): T;
}

export interface SendOptions {
  method?: string;
  headers?: Record<string, string | string[]>;
  body?: Buffer | string | Readable;
  agent?: Agent | false;
  /** Source address of the connection (127.0.0.2: not the address the server listens on). */
  localAddress?: string;
}

export function send(url: string, o: SendOptions = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const req = httpRequest({
      host: u.hostname,
      port: u.port,
      path: `${u.pathname}${u.search}`,
      method: o.method ?? 'GET',
      headers: o.headers ?? {},
      agent: o.agent ?? false,
      ...(o.localAddress ? { localAddress: o.localAddress } : {}),
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, json: <T>() => JSON.parse(body.toString('utf8')) as T });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (o.body instanceof Readable) o.body.pipe(req);
    else req.end(o.body);
  });
}

export interface Harness {
  proxy: RunningServerProxy;
  /** The proxy's listener. */
  url: string;
  /** The management routes' own loopback listener (--api-port), where `put` writes. */
  apiUrl: string;
  dir: string;
  /** PUT the document; returns the new generation. */
  put(doc: unknown): Promise<number>;
  close(): Promise<void>;
}

export async function startHarness(options: Partial<ServerProxyServerOptions> = {}, deps: ServerProxyDeps = {}): Promise<Harness> {
  const { dir, cleanup } = tmpDir('dp-sp-');
  const proxy = await startServerProxy(
    { db: `sqlite:${dir}/proxy.db`, port: 0, apiPort: 0, stateDir: `${dir}/state`, ...options },
    { logger: pino({ level: 'silent' }), ...deps },
  );
  return {
    proxy,
    url: proxy.url,
    apiUrl: proxy.apiUrl!,
    dir,
    async put(doc) {
      const r = await send(`${proxy.apiUrl}/api/v1/state`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(doc),
      });
      if (r.status !== 200) throw new Error(`PUT /api/v1/state → ${r.status} ${r.body.toString()}`);
      return r.json<{ generation: number }>().generation;
    },
    async close() {
      await proxy.close();
      cleanup();
    },
  };
}

/** Poll until `url` answers `status`. */
export function untilStatus(url: string, status: number, timeoutMs = 10_000): Promise<Reply> {
  return eventually(async () => {
    const r = await send(url);
    return r.status === status ? r : undefined;
  }, timeoutMs);
}

export function doc(services: Record<string, unknown>[], projects = ['test-proj', 'my-proj']): Record<string, unknown> {
  return { apiVersion: 'proxy.dstack.ai/v1alpha1', kind: 'ProxyState', spec: { projects: projects.map((name) => ({ name })), services } };
}

export function directService(project: string, run: string, port: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    project,
    run,
    auth: false,
    replicas: [{ id: `${run}-0`, appPort: port, direct: { host: '127.0.0.1', port } }],
    ...extra,
  };
}

/** `total` bytes, one reused 1 MiB chunk at a time, as fast as the reader takes them. */
export function zeros(total: number): Readable {
  const chunkSize = 1024 * 1024;
  const chunk = Buffer.alloc(chunkSize, 7);
  let left = total;
  return new Readable({
    read() {
      if (left <= 0) return void this.push(null);
      const n = Math.min(left, chunkSize);
      left -= n;
      this.push(n === chunkSize ? chunk : chunk.subarray(0, n));
    },
  });
}

export interface PluginApp {
  app: FastifyInstance;
  port: number;
  /** Connections opened to the replica so far. */
  connects(): number;
}

/**
 * registerServerProxy on a bare fastify app (which also has GET /other → {fastify: true}),
 * listening on 127.0.0.1, whose service p/r is one direct replica on `replicaPort` reached over
 * TCP; connections to it are counted.
 */
export async function startPluginApp(
  replicaPort: number,
  o: { clientMaxBodySize: number; fastPath?: boolean; rateLimits?: unknown[]; clock?: Clock },
): Promise<PluginApp> {
  const state: ProxyState = emptyState();
  state.spec.services.push({
    project: 'p',
    run: 'r',
    https: false,
    auth: false,
    stripPrefix: true,
    clientMaxBodySize: o.clientMaxBodySize,
    rateLimits: o.rateLimits ?? [],
    replicas: [{ id: 'a', appPort: replicaPort, direct: { host: '127.0.0.1', port: replicaPort } }],
  } as unknown as Service);
  let connects = 0;
  const replicas = replicasOf({ 'p/r': [tcpUpstream(replicaPort, '127.0.0.1', () => connects++)] });
  const app = fastify();
  app.get('/other', async () => ({ fastify: true }));
  app.addHook('onClose', () => replicas.close());
  await registerServerProxy(app, {
    getState: () => state,
    replicas,
    authorize: async () => 'allow',
    ...(o.fastPath === undefined ? {} : { fastPath: o.fastPath }),
    ...(o.clock ? { clock: o.clock } : {}),
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, port: (app.server.address() as { port: number }).port, connects: () => connects };
}
