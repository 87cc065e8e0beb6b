// The OpenAI-compatible model API as a fastify plugin, mounted by both deployments:
//   gateway API   prefix '/api/models/:project' (entrypoint sites proxy `/` to it)
//   in-server     prefix '/proxy/models/:project'
//   fixed project prefix '' with `project`
// Routes: GET <base>/models, GET <base>/models/<id…>, POST <base>/chat/completions.
// Every request is authorised before anything is looked up (unknown project → 403, as dstack).

import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { bearerToken, type AuthDecision } from '../auth/index.js';
import { withErrorPath } from '../http1/index.js';
import type { ProxyState, Service } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';
import { catalogOf, observeModels, type ModelEntry } from './catalog.js';
import { ModelApiError, toModelError, unauthorized, upstreamError } from './errors.js';
import { memoryFirstSeenStore, modelKey, type FirstSeenStore } from './first-seen.js';
import { peerClient } from './forwarders.js';
import { chatRequest, parseJsonBody, tgiParams, type ChatRequest } from './request.js';
import { dataLines, DONE_FRAME, errorFrame } from './sse.js';
import { renderPrompt } from './template.js';
import { stopList, tgiCompletion, tgiPayload, tgiStreamConverter } from './tgi.js';
import { ClientAbort, type ForwardedClient, type UpstreamRequest, type UpstreamResponse } from './types.js';

export interface ModelApiOptions {
  /** '/api/models/:project', '/proxy/models/:project', or '' with `project` set. */
  prefix: string;
  /** The project when the prefix has no `:project` (an entrypoint of one project). */
  project?: string;
  getState: () => ProxyState;
  authorize: (project: string, token: string) => Promise<AuthDecision>;
  forward: (service: Service, request: UpstreamRequest) => Promise<UpstreamResponse>;
  /** For `created` and completion timestamps. Default the system clock. */
  clock?: { now(): number };
  /** Where first-seen times live. Default in memory (lost on restart). */
  firstSeen?: FirstSeenStore;
  /** Largest request body. Default 64 MiB (DEFAULT_CLIENT_MAX_BODY_SIZE). */
  bodyLimit?: number;
  /** Completion ids. Default `chatcmpl-<32 hex>`. */
  newId?: () => string;
  /** Who the client is, passed on to the forwarder. Default: the connection's peer, its headers. */
  clientOf?: (req: FastifyRequest) => ForwardedClient;
}

/** A replica error body is read up to this size; the rest is dropped. */
const MAX_ERROR_BODY = 64 * 1024; // 64 KiB

/** What the routes share: the options and the defaults filled in. */
interface Api {
  o: ModelApiOptions;
  firstSeen: FirstSeenStore;
  newId: () => string;
  nowSec: () => number;
  clientOf: (req: FastifyRequest) => ForwardedClient;
  projectOf: (req: FastifyRequest) => string;
}

export async function registerModelApi(app: FastifyInstance, o: ModelApiOptions): Promise<void> {
  if (!o.prefix.includes(':project') && !o.project) throw new TypeError('registerModelApi: a prefix without :project needs `project`');
  const clock = o.clock ?? { now: () => Date.now() };
  const api: Api = {
    o,
    firstSeen: o.firstSeen ?? memoryFirstSeenStore(),
    newId: o.newId ?? (() => `chatcmpl-${randomUUID().replace(/-/g, '')}`),
    nowSec: () => Math.floor(clock.now() / 1000),
    clientOf: o.clientOf ?? peerClient,
    projectOf: (req) => ((req.params as { project?: string }).project ?? o.project ?? '').toLowerCase(),
  };
  await app.register(
    async (scope) => {
      installErrorShape(scope, o.prefix, o.bodyLimit ?? 64 * 1024 * 1024);
      scope.addHook('onRequest', corsAndAuth(api));
      scope.options('/*', async () => undefined);
      scope.get('/models', async (req) => listModels(api, req));
      scope.get('/models/*', async (req) => describeModel(api, req));
      scope.post('/chat/completions', async (req, reply) => chatCompletion(api, req, reply));
    },
    { prefix: o.prefix },
  );
}

/** Bodies as raw bytes, every error in this API's shape, unknown paths too (under a prefix). */
function installErrorShape(scope: FastifyInstance, prefix: string, bodyLimit: number): void {
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit }, (_req, body, done) => done(null, body));
  scope.setErrorHandler((err: FastifyError | ModelApiError, req, reply) => {
    const e = err instanceof ModelApiError ? err : fastifyError(err);
    if (e.status >= 500) req.log.error({ err }, e.message);
    return reply.code(e.status).send(e.body());
  });
  // Under a prefix, unknown paths answer in this API's error shape; at the root, the app's own
  // 404 handler stays in charge.
  if (prefix !== '') {
    scope.setNotFoundHandler((req, reply) => {
      const e = new ModelApiError(404, `Not Found: ${req.method} ${req.url.split('?')[0]}`, { detail: 'Not Found' });
      return reply.code(404).send(e.body());
    });
  }
}

/** CORS for browsers (preflights answered here), then the project member's token, before anything is looked up. */
function corsAndAuth(api: Api): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply | undefined> {
  return async (req, reply) => {
    void reply.header('access-control-allow-origin', '*');
    if (req.method === 'OPTIONS') {
      const asked = req.headers['access-control-request-headers'];
      return reply
        .code(204)
        .header('access-control-allow-methods', 'GET, POST, OPTIONS')
        .header('access-control-allow-headers', typeof asked === 'string' && asked !== '' ? asked : '*')
        .header('access-control-max-age', '600')
        .send();
    }
    const project = api.projectOf(req);
    const token = bearerToken(req.headers.authorization);
    const decision = token === null ? 'unauthenticated' : await api.o.authorize(project, token);
    if (decision !== 'allow') throw unauthorized(project);
    return undefined;
  };
}

function lookup(api: Api, project: string, name: string): ModelEntry {
  const entry = catalogOf(api.o.getState()).get(project)?.get(name);
  if (!entry) throw new ModelApiError(404, `Model ${name} not found in project ${project}`);
  return entry;
}

function describe(api: Api, project: string, name: string, created: Map<string, number>) {
  return { object: 'model' as const, id: name, created: created.get(modelKey(project, name)) ?? api.nowSec(), owned_by: project };
}

async function listModels(api: Api, req: FastifyRequest) {
  const project = api.projectOf(req);
  const state = api.o.getState();
  const created = await observeModels(api.firstSeen, state, api.nowSec());
  const names = [...(catalogOf(state).get(project)?.keys() ?? [])];
  return { object: 'list', data: names.map((n) => describe(api, project, n, created)) };
}

async function describeModel(api: Api, req: FastifyRequest) {
  const project = api.projectOf(req);
  const id = (req.params as { '*': string })['*'];
  const entry = lookup(api, project, id);
  const created = await observeModels(api.firstSeen, api.o.getState(), api.nowSec());
  return describe(api, project, entry.name, created);
}

async function chatCompletion(api: Api, req: FastifyRequest, reply: FastifyReply) {
  const raw = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
  const chat = chatRequest(parseJsonBody(raw));
  const { service } = lookup(api, api.projectOf(req), chat.model);
  if (service.replicas.length === 0) throw new ModelApiError(503, `Service ${serviceKey(service)} has no running replicas`);
  const abort = new ClientAbort();
  const client = api.clientOf(req);
  // The client went away before the answer was complete: the replica stops generating.
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) abort.abort();
  });
  const model = service.model;
  const call = (path: string, body: Buffer | string): Promise<UpstreamResponse> => callReplica(api, service, path, body, abort, client);
  if (model.format === 'openai') return openaiCompletion(reply, call, model.prefix, raw, abort);
  return tgiCompletionRoute(api, reply, call, model, chat, abort);
}

type Call = (path: string, body: Buffer | string) => Promise<UpstreamResponse>;

/** One request to the service; a non-2xx answer becomes the error the client gets. */
async function callReplica(
  api: Api,
  service: Service,
  path: string,
  body: Buffer | string,
  abort: ClientAbort,
  client: ForwardedClient,
): Promise<UpstreamResponse> {
  let res: UpstreamResponse;
  try {
    res = await api.o.forward(service, { path, body, signal: abort, client });
  } catch (err) {
    throw toModelError(err, serviceKey(service));
  }
  if (res.status < 200 || res.status > 299) {
    const text = await readCapped(res.body, MAX_ERROR_BODY).catch(() => '');
    throw upstreamError(service.model?.name ?? serviceKey(service), res.status, headerValue(res.headers['content-type']), text);
  }
  return res;
}

async function openaiCompletion(reply: FastifyReply, call: Call, prefix: string, raw: Buffer, abort: ClientAbort) {
  const res = await call(completionsPath(prefix), raw);
  const type = headerValue(res.headers['content-type']) ?? 'application/json';
  const sse = type.startsWith('text/event-stream');
  void reply.code(res.status).header('content-type', type);
  if (sse) void reply.header('x-accel-buffering', 'no').header('cache-control', 'no-cache');
  // A small answer the forwarder read whole goes out in one write with its length; a larger
  // JSON answer is piped as is (a failure mid-body resets the response); an event stream
  // goes through relay() so that a failure becomes an SSE error event.
  if (!sse && Buffer.isBuffer(res.body)) return reply.send(res.body);
  const body = streamOf(res.body);
  return reply.send(sse ? withErrorPath(Readable.from(relay(body, abort))) : body);
}

/** A chat on a TGI replica: the prompt rendered from the model's template, the answer converted to OpenAI's shape. */
async function tgiCompletionRoute(
  api: Api,
  reply: FastifyReply,
  call: Call,
  model: Extract<Service['model'], { format: 'tgi' }>,
  chat: ChatRequest,
  abort: ClientAbort,
) {
  const params = tgiParams(chat.body);
  if (!model.chatTemplate) throw new ModelApiError(400, `Model ${model.name} has no chat template`);
  const bosToken = model.bosToken ?? '';
  const eosToken = model.eosToken ?? '';
  const prompt = renderPrompt(model.chatTemplate, { messages: params.messages, bosToken, eosToken });
  const stop = stopList(params.stop, model.eosToken);
  const payload = JSON.stringify(tgiPayload(prompt, params, stop, chat.stream));
  const ctx = { id: api.newId(), created: api.nowSec(), model: chat.model, stop };
  const res = await call(chat.stream ? '/generate_stream' : '/generate', payload);
  if (!chat.stream) {
    const text = await readCapped(res.body, Number.POSITIVE_INFINITY).catch((err: unknown) => {
      throw toModelError(err);
    });
    let data: unknown;
    try {
      data = JSON.parse(text);
    } catch {
      throw new ModelApiError(502, 'Invalid response from model: not JSON');
    }
    return reply.send(tgiCompletion(data, ctx));
  }
  const frames = await tgiFrames(streamOf(res.body), tgiStreamConverter({ ...ctx, includeUsage: chat.includeUsage }), abort);
  return reply
    .code(200)
    .header('content-type', 'text/event-stream; charset=utf-8')
    .header('cache-control', 'no-cache')
    .header('x-accel-buffering', 'no')
    .send(withErrorPath(Readable.from(frames)));
}

/**
 * TGI's event stream as OpenAI's chunks. The first frames are read before this returns, so
 * that an early failure is an HTTP error; a later one ends the stream with an SSE error event.
 */
async function tgiFrames(
  body: Readable,
  converter: ReturnType<typeof tgiStreamConverter>,
  abort: ClientAbort,
): Promise<AsyncGenerator<string>> {
  const lines = dataLines(body)[Symbol.asyncIterator]();
  const convert = (payload: string): string[] => {
    let data: unknown;
    try {
      data = JSON.parse(payload);
    } catch {
      throw new ModelApiError(502, 'Invalid chunk in model stream: not JSON');
    }
    return converter.event(data);
  };
  const first: string[] = [];
  try {
    while (first.length === 0) {
      const n = await lines.next();
      if (n.done) break;
      if (n.value !== '[DONE]') first.push(...convert(n.value));
    }
  } catch (err) {
    body.destroy();
    throw toModelError(err);
  }
  async function* frames(): AsyncGenerator<string> {
    try {
      yield* first;
      for (;;) {
        const n = await lines.next();
        if (n.done) break;
        if (n.value === '[DONE]') continue;
        yield* convert(n.value);
      }
      if (!converter.done) throw new ModelApiError(502, 'The model stream ended before its final event');
      yield DONE_FRAME;
    } catch (err) {
      if (!abort.aborted) yield errorFrame(toModelError(err));
    } finally {
      body.destroy();
    }
  }
  return frames();
}

/** The replica's body as it arrives; a failure mid-SSE ends the stream with an error event. */
async function* relay(body: Readable, abort: ClientAbort): AsyncGenerator<Buffer | string> {
  let tail = '\n\n';
  try {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      if (chunk.length === 0) continue;
      tail = chunk.subarray(-2).toString('latin1');
      yield chunk;
    }
  } catch (err) {
    if (abort.aborted) throw err;
    yield (tail.endsWith('\n\n') ? '' : tail.endsWith('\n') ? '\n' : '\n\n') + errorFrame(toModelError(err));
  } finally {
    body.destroy();
  }
}

/** `<prefix>/chat/completions` on the replica, per prefix (a handful per document). */
const completionsPaths = new Map<string, string>();
function completionsPath(prefix: string): string {
  let path = completionsPaths.get(prefix);
  if (path === undefined) {
    const base = prefix === '' || prefix.startsWith('/') ? prefix : `/${prefix}`;
    path = `${base.replace(/\/+$/, '')}/chat/completions`;
    if (completionsPaths.size < 1024) completionsPaths.set(prefix, path);
  }
  return path;
}

function streamOf(body: Readable | Buffer): Readable {
  return withErrorPath(Buffer.isBuffer(body) ? Readable.from([body]) : body);
}

async function readCapped(body: Readable | Buffer, max: number): Promise<string> {
  if (Buffer.isBuffer(body)) return body.subarray(0, max).toString('utf8');
  const parts: Buffer[] = [];
  let size = 0;
  try {
    for await (const c of body as AsyncIterable<Buffer | string>) {
      const b = typeof c === 'string' ? Buffer.from(c) : c;
      parts.push(b);
      size += b.length;
      if (size >= max) break;
    }
  } finally {
    body.destroy();
  }
  return Buffer.concat(parts).subarray(0, max).toString('utf8');
}

function headerValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function fastifyError(err: FastifyError): ModelApiError {
  if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new ModelApiError(413, 'The request body is too large');
  if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500)
    return new ModelApiError(err.statusCode, err.message);
  return toModelError(err);
}
