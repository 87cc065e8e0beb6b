// The pieces the dstack end-to-end suites share: a gateway with the dstack compatibility routes
// on (restartable on the same state dir and ports), a client that plays dstack's server — its
// calls over plain HTTP, no token, one at a time, as the server's sync sends them, with the
// payloads of fixtures.ts — and an app that records what reached it and answers both plain
// requests and OpenAI chat calls.

import type { LookupAddress } from 'node:dns';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Agent, fetch as undiciFetch, type RequestInit as UndiciRequestInit } from 'undici';
import { startGateway, type GatewayDeps } from '../../../src/daemon/gateway.js';
import { resolveOptions } from '../../../src/gateway/options.js';
import { api, type HttpReply, type TestGateway } from '../../helpers/gateway.js';
import { close } from '../../helpers/http.js';
import { freePorts } from '../../helpers/ports.js';
import { tmpDir } from '../../helpers/tmp.js';
import {
  dstackPaths,
  type ConfigPayload,
  type RegisterEntrypointPayload,
  type RegisterReplicaPayload,
  type RegisterServicePayload,
} from './fixtures.js';

// ── the gateway ───────────────────────────────────────────────────────────────────────────

export interface CompatGatewayOptions {
  /** Reuse a state dir and ports: a restart of the same gateway. */
  reuse?: { stateDir: string; apiPort: number; httpPort: number; httpsPort: number };
  /** More gateway options by name (serverUrl, acmeCaBundle …). */
  flags?: Record<string, string>;
  deps?: GatewayDeps;
}

/** Fast tunnel keepalives and reconnects: a test notices a dead hop in seconds, not minutes. */
export const FAST_SSH: GatewayDeps = { ssh: { keepaliveIntervalMs: 1_000, reconnect: { baseMs: 200, maxMs: 1_000 } } };

/**
 * A gateway with `--dstack-compat true` on 127.0.0.1 (free ports unless reused) and its private
 * Nginx. `cleanup()` removes the state dir only when this call made it.
 */
export async function startCompatGateway(o: CompatGatewayOptions = {}): Promise<TestGateway> {
  const tmp = o.reuse ? undefined : tmpDir('dp-dstack-');
  const stateDir = o.reuse?.stateDir ?? join(tmp!.dir, 'state');
  const [apiPort, httpPort, httpsPort] = o.reuse
    ? [o.reuse.apiPort, o.reuse.httpPort, o.reuse.httpsPort]
    : ((await freePorts(3)) as [number, number, number]);
  const options = resolveOptions({
    flags: {
      stateDir,
      apiHost: '127.0.0.1',
      apiPort: String(apiPort),
      httpPort: String(httpPort),
      httpsPort: String(httpsPort),
      listenHost: '127.0.0.1',
      logLevel: 'silent',
      resyncInterval: '3600',
      dstackCompat: 'true',
      ...o.flags,
    },
  });
  const gw = await startGateway(options, { ...FAST_SSH, ...o.deps }).catch((err: unknown) => {
    tmp?.cleanup();
    throw err;
  });
  let closed: Promise<void> | undefined;
  const closeGw = (): Promise<void> => (closed ??= gw.close());
  return {
    gw,
    stateDir,
    apiPort,
    httpPort,
    httpsPort,
    close: closeGw,
    cleanup: async () => {
      await closeGw();
      tmp?.cleanup();
    },
  };
}

/** The stored document's generation, read from the gateway's store. */
export async function generation(t: TestGateway): Promise<number> {
  return (await t.gw.store.read()).generation;
}

export interface DstackReply {
  status: number;
  json: unknown;
  body: string;
}

/** A POST (a body, or none for the unregisters) or a GET, as dstack's GatewayClient sends it. */
export async function dstack(t: TestGateway, path: string, body?: unknown, method = 'POST'): Promise<DstackReply> {
  const r = await api(t, { method, path, ...(body !== undefined ? { body } : {}) });
  return { status: r.status, json: r.json, body: r.body };
}

export interface Listed {
  id: string | null;
  project_name: string;
  run_name: string;
  replicas: { id: string }[];
}

/** `services/list` as the server reads it. */
export async function listed(t: TestGateway): Promise<Listed[]> {
  const r = await api(t, { path: dstackPaths.list });
  if (r.status !== 200) throw new Error(`services/list answered ${r.status}: ${r.body}`);
  return (r.json as { services: Listed[] }).services;
}

/** The stored document's generation (GET /api/v1/state). */
export async function generationOf(t: { apiPort: number }): Promise<number> {
  const r = await api(t, { path: '/api/v1/state' });
  if (r.status !== 200) throw new Error(`GET /api/v1/state answered ${r.status}: ${r.body}`);
  return (r.json as { metadata: { generation: number } }).metadata.generation;
}

// ── dstack's server ───────────────────────────────────────────────────────────────────────

export interface Answer extends HttpReply {
  json: unknown;
  /** Milliseconds from sending to the full answer. */
  ms: number;
}

export interface ListedService {
  id: string | null;
  project_name: string;
  run_name: string;
  replicas: { id: string }[];
}

export interface StatsRow {
  project_name: string;
  run_name: string;
  stats: Record<string, { requests: number; request_time: number }>;
}

/**
 * dstack's server as its gateway client behaves: `http://gateway` over the tunnel (here the
 * gateway API port), no Authorization header, JSON bodies, and one call at a time — the sync
 * awaits each answer before the next call. `port` is read on every call, so the same client
 * keeps talking to a restarted gateway.
 */
export class DstackServer {
  #queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly target: () => { apiPort: number }) {}

  call(method: 'GET' | 'POST', path: string, body?: unknown): Promise<Answer> {
    const run = async (): Promise<Answer> => {
      const started = Date.now();
      const r = await api(this.target(), { method, path, ...(body !== undefined ? { body } : {}) });
      return { ...r, ms: Date.now() - started };
    };
    const next = this.#queue.then(run, run);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  config(body: ConfigPayload): Promise<Answer> {
    return this.call('POST', dstackPaths.config, body);
  }

  async list(): Promise<ListedService[]> {
    const r = await this.call('GET', dstackPaths.list);
    if (r.status !== 200) throw new Error(`services/list answered ${r.status}: ${r.body}`);
    return sortListed((r.json as { services: ListedService[] }).services);
  }

  registerEntrypoint(project: string, body: RegisterEntrypointPayload): Promise<Answer> {
    return this.call('POST', dstackPaths.registerEntrypoint(project), body);
  }

  registerService(project: string, body: RegisterServicePayload): Promise<Answer> {
    return this.call('POST', dstackPaths.registerService(project), body);
  }

  unregisterService(project: string, run: string): Promise<Answer> {
    return this.call('POST', dstackPaths.unregisterService(project, run));
  }

  registerReplica(project: string, run: string, body: RegisterReplicaPayload): Promise<Answer> {
    return this.call('POST', dstackPaths.registerReplica(project, run), body);
  }

  unregisterReplica(project: string, run: string, jobId: string): Promise<Answer> {
    return this.call('POST', dstackPaths.unregisterReplica(project, run, jobId));
  }

  async stats(): Promise<StatsRow[]> {
    const r = await this.call('GET', dstackPaths.stats);
    if (r.status !== 200) throw new Error(`stats/collect answered ${r.status}: ${r.body}`);
    return r.json as StatsRow[];
  }

  /**
   * The sync's unregister step: every listed service `expected` does not name is unregistered,
   * and every listed replica of an expected service it does not name. `expected`: run → job ids.
   */
  async syncUnregister(project: string, expected: Record<string, string[]>): Promise<Answer[]> {
    const out: Answer[] = [];
    for (const s of await this.list()) {
      if (s.project_name !== project) continue;
      const jobs = expected[s.run_name];
      if (!jobs) {
        out.push(await this.unregisterService(project, s.run_name));
        continue;
      }
      for (const r of s.replicas) if (!jobs.includes(r.id)) out.push(await this.unregisterReplica(project, s.run_name, r.id));
    }
    return out;
  }
}

export function sortListed(services: ListedService[]): ListedService[] {
  return services
    .map((s) => ({ ...s, replicas: [...s.replicas].sort((a, b) => a.id.localeCompare(b.id)) }))
    .sort((a, b) => `${a.project_name}/${a.run_name}`.localeCompare(`${b.project_name}/${b.run_name}`));
}

// ── the replica app ───────────────────────────────────────────────────────────────────────

export interface SeenRequest {
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export interface CountingApp {
  name: string;
  port: number;
  seen: SeenRequest[];
  close(): Promise<void>;
}

/**
 * A replica's app on 127.0.0.1: `POST <any>/chat/completions` answers an OpenAI completion
 * naming the app, anything else JSON {name, method, url, headers}. Every request is recorded.
 */
export async function startCountingApp(name: string): Promise<CountingApp> {
  const seen: SeenRequest[] = [];
  const srv: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts).toString('utf8');
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      res.setHeader('content-type', 'application/json');
      if (req.method === 'POST' && (req.url ?? '').endsWith('/chat/completions')) {
        const model = (JSON.parse(body || '{}') as { model?: string }).model ?? 'unknown';
        res.end(
          JSON.stringify({
            id: `chatcmpl-${name}`,
            object: 'chat.completion',
            created: 1,
            model,
            choices: [{ index: 0, message: { role: 'assistant', content: `Hello from ${name}` }, finish_reason: 'stop' }],
            usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
          }),
        );
        return;
      }
      res.end(JSON.stringify({ name, method: req.method, url: req.url, headers: req.headers }));
    });
  });
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', resolve);
  });
  return { name, port: (srv.address() as AddressInfo).port, seen, close: () => close(srv) };
}

// ── clients of the data path ──────────────────────────────────────────────────────────────

/** Every name resolves to 127.0.0.1, so an SDK keeps the real domain in its URLs and Host header. */
export function loopbackFetch(): { fetch: typeof fetch; close: () => Promise<void> } {
  const agent = new Agent({
    connect: {
      lookup: (
        _host: string,
        opts: { all?: boolean },
        cb: (err: Error | null, address: string | LookupAddress[], family?: number) => void,
      ) => {
        if (opts.all) cb(null, [{ address: '127.0.0.1', family: 4 }]);
        else cb(null, '127.0.0.1', 4);
      },
    },
  });
  const viaLoopback = ((input: string | URL | Request, init?: RequestInit) =>
    undiciFetch(input instanceof Request ? input.url : input, {
      ...(init as UndiciRequestInit),
      dispatcher: agent,
    })) as unknown as typeof fetch;
  return { fetch: viaLoopback, close: () => agent.close() };
}
