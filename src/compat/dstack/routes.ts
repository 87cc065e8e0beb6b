// dstack's gateway API over the document: each call is parsed as dstack's request models would
// (a malformed one is a 422 in FastAPI's shape), applied as one pure change written through the
// compat write path, and answered as dstack's gateway answers: 200 {"status":"ok"}, an
// expected failure 400 {"detail": "<text>"}. The server terminates runs on gateway errors, so
// nothing expected is ever a 5xx; an unexpected error is a 500 {"detail": …} without secrets.
// The routes live in scopes of their own, so their error and not-found answers are FastAPI's
// while the rest of the API keeps its {code, message} shape.

import { isDeepStrictEqual } from 'node:util';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Clock } from '../../clock.js';
import { ProxyError } from '../../errors.js';
import { serviceKey, type Entrypoint, type ProxyState, type Replica, type Service } from '../../spec/index.js';
import type { StoredState } from '../../state/store.js';
import { SSH_LOOP } from '../../reconcilers/outputs.js';
import type { Call } from './calls.js';
import { applyCall, listServices, type Outcome } from './mapper.js';
import { jsonInvalidDetail, parseCall, type PathParams } from './requests.js';
import type { CompatWriter, WriteAnswer } from './store-write.js';
import { cannotRegisterReplica, certificateFailed, certificateTimedOut } from './texts.js';
import {
  replicaCheck,
  passCheck,
  replicaTimeout,
  siteCheck,
  waitForCertificate,
  waitForStatus,
  type CertFailure,
  type StatusSource,
} from './waits.js';

export interface DstackRoutesOptions {
  writer: CompatWriter;
  /** The stored document, for `services/list`. */
  read: () => Promise<StoredState>;
  status: StatusSource;
  /** Seconds a replicas/register waits for the replica to be Ready. */
  replicaWaitS: number;
  /** `wait`: an https registration answers once its certificate is there or its first attempt failed. */
  tls: 'wait' | 'async';
  /** Seconds a certbot run may take: the certificate wait's bound, plus a margin. */
  certbotTimeoutS: number;
  /** Aborted when the daemon closes: waits end at once. */
  signal: AbortSignal;
  /** The waits' bounds run on it. */
  clock: Clock;
  /**
   * How a new domain becomes reachable. Absent: nothing waits for it. Present: a registration
   * that brings a new domain in answers once it is reachable — for a service our default server
   * serves by Host until its own site is (`byHost`), once the data plane routes it (the SSH
   * loop's pass at the generation written), no reload waited for; for any other, once Nginx
   * serves its new site: the wait asks the Nginx loop to reload without waiting out its interval
   * (`hurry`), and registrations that arrive together share that reload.
   */
  sites?: { byHost(service: Service): boolean; hurry(generation: number): void };
  version: string;
  logger: Logger;
}

/** The margin on top of a certbot run before a certificate wait gives up: the pass that starts it, the DNS check. */
const CERT_WAIT_MARGIN_S = 20;

/**
 * How long a registration waits for its new domain to be reachable: a pass that routes it, or a
 * reload and its confirmation that no worker of the configuration before still accepts (Nginx's
 * own wait for that is 15 s).
 */
const SITE_WAIT_MS = 30_000;

/** Every domain a document has a site for. */
function siteDomains(state: ProxyState): Set<string> {
  const out = new Set<string>();
  for (const s of state.spec.services) if (s.domain !== undefined) out.add(s.domain);
  for (const e of state.spec.entrypoints) out.add(e.domain);
  return out;
}

type RouteKind = Call['kind'];

/** FastAPI's `{"detail": "Not Found"}` and friends. */
function detail(reply: FastifyReply, status: number, text: unknown): FastifyReply {
  return reply.code(status).header('content-type', 'application/json; charset=utf-8').send({ detail: text });
}

/** Answers of the scope: FastAPI's shapes, not the management API's. */
function fastApiShapes(scope: FastifyInstance, logger: Logger): void {
  // JSON bodies as text, parsed by the route, so a malformed one is FastAPI's 422 json_invalid.
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser('*', { parseAs: 'string' }, (_req, body, done) => done(null, body));
  scope.setNotFoundHandler((_request, reply) => detail(reply, 404, 'Not Found'));
  scope.setErrorHandler((err: FastifyError | ProxyError, request, reply) => {
    if (err instanceof ProxyError && err.status < 500) return detail(reply, err.status, err.message);
    const fe = err as FastifyError;
    if (!(err instanceof ProxyError) && typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
      return detail(reply, fe.statusCode, fe.message);
    }
    logger.error({ err, method: request.method, url: request.url.split('?')[0] }, 'dstack call failed unexpectedly');
    // Our own errors carry no secrets in their messages; anything else may, so it stays in the log.
    return detail(reply, 500, err instanceof ProxyError ? err.message : 'Internal Server Error');
  });
}

/** The body as FastAPI hands it to pydantic, or FastAPI's 422 for JSON that does not parse. */
function jsonBody(request: FastifyRequest): { ok: true; body: unknown } | { ok: false; detail: unknown[] } {
  const text = typeof request.body === 'string' ? request.body : undefined;
  if (text === undefined || text.trim() === '') return { ok: true, body: undefined };
  try {
    return { ok: true, body: JSON.parse(text) as unknown };
  } catch (err) {
    const position = /position (\d+)/.exec((err as Error).message)?.[1];
    return { ok: false, detail: jsonInvalidDetail(position === undefined ? 0 : Number(position)) };
  }
}

/** What a log line may say about a call: names, never keys. */
function describe(call: Call): Record<string, string> {
  const out: Record<string, string> = { call: call.kind };
  if ('project' in call) out.project = call.project;
  if ('run' in call) out.run = call.run;
  if (call.kind === 'registerService') out.run = call.body.run_name;
  if (call.kind === 'registerReplica') out.replica = call.body.job_id;
  if (call.kind === 'unregisterReplica') out.replica = call.jobId;
  return out;
}

function findService(state: ProxyState, project: string, run: string): Service | undefined {
  return state.spec.services.find((s) => s.project === project && s.run === run);
}

function findEntrypoint(state: ProxyState, project: string): Entrypoint | undefined {
  return state.spec.entrypoints.find((e) => e.project === project);
}

function withServices(state: ProxyState, services: Service[]): Outcome {
  return { kind: 'changed', state: { ...state, spec: { ...state.spec, services } } };
}

export async function dstackRoutes(app: FastifyInstance, o: DstackRoutesOptions): Promise<void> {
  const { writer, logger } = o;
  const apply = (call: Call): Promise<WriteAnswer> => writer.write((cur) => applyCall(cur.state, call), describe(call));

  /** A registration undone because what it promised did not come true; only if it is still what we wrote. */
  const undo = async (what: Record<string, string>, change: (cur: ProxyState) => Outcome): Promise<void> => {
    try {
      await writer.write((cur) => change(cur.state), { ...what, call: `${what.call ?? ''}:rollback` });
    } catch (err) {
      logger.error({ err, ...what }, 'rolling a failed dstack registration back failed');
    }
  };

  const closed = (reply: FastifyReply): FastifyReply => detail(reply, 503, 'The gateway is shutting down');

  const certFailureText = (domain: string, f: CertFailure): string => {
    if (f.kind === 'issue') return certificateFailed(domain, f.error ?? 'the ACME server refused it');
    const base = certificateTimedOut(domain, o.certbotTimeoutS);
    return f.kind === 'dns' && f.error ? `${base} (${f.error})` : base;
  };

  /** An https registration in wait mode: the domain's certificate, or the reason it has none. */
  const certificate = async (domain: string, generation: number): Promise<{ ok: true } | { ok: false; text: string } | 'closed'> => {
    const r = await waitForCertificate(o.status, domain, generation, {
      timeoutMs: (o.certbotTimeoutS + CERT_WAIT_MARGIN_S) * 1000,
      signal: o.signal,
      clock: o.clock,
    });
    if (r.kind === 'closed') return 'closed';
    if (r.kind === 'ready') return { ok: true };
    return { ok: false, text: certFailureText(domain, r.failure) };
  };

  /**
   * A registration that brought `domain` into the document (it had no site before): answered
   * once the domain is reachable (see DstackRoutesOptions.sites), or a bounded wait later. Not a
   * failure when that is late or Nginx refused the site: what was registered stays, and the
   * site's status says why it is not served.
   */
  const newDomain = async (
    answer: Extract<WriteAnswer, { kind: 'written' }>,
    domain: string,
    byHost: boolean,
    what: Record<string, string>,
  ): Promise<'closed' | undefined> => {
    if (o.sites === undefined || !answer.changed || siteDomains(answer.previous).has(domain)) return undefined;
    if (!byHost) o.sites.hurry(answer.generation);
    const check = byHost ? passCheck(SSH_LOOP, answer.generation) : siteCheck(domain, answer.generation);
    const r = await waitForStatus(o.status, check, {
      timeoutMs: SITE_WAIT_MS,
      onTimeout: () => ({ kind: 'failed', reason: `not reachable within ${SITE_WAIT_MS / 1000} s` }),
      signal: o.signal,
      clock: o.clock,
    });
    if (r.kind === 'closed') return 'closed';
    if (r.kind === 'failed') logger.warn({ ...what, domain, reason: r.reason }, 'registered, but its domain is not served yet');
    return undefined;
  };

  const handle = async (kind: RouteKind, request: FastifyRequest, reply: FastifyReply, withBody: boolean): Promise<FastifyReply> => {
    let body: unknown = undefined;
    if (withBody) {
      const b = jsonBody(request);
      if (!b.ok) return detail(reply, 422, b.detail);
      body = b.body;
    }
    const parsed = parseCall(kind, (request.params ?? {}) as PathParams, body);
    if (!parsed.ok) return detail(reply, 422, parsed.detail);
    const call = parsed.call;
    const what = describe(call);
    const answer = await apply(call);
    if (answer.kind === 'refused') {
      logger.info({ ...what, detail: answer.detail }, 'dstack call refused');
      return detail(reply, 400, answer.detail);
    }

    if (call.kind === 'registerReplica') {
      const { project, run } = call;
      const id = call.body.job_id;
      const written = findService(answer.state, project, run)?.replicas.find((r) => r.id === id);
      // Accepted without a replica of that id under the service: nothing of ours to wait on.
      if (written === undefined) return reply.send({ status: 'ok' });
      const sk = serviceKey({ project, run });
      const r = await waitForStatus(o.status, replicaCheck(sk, id, answer.generation), {
        timeoutMs: o.replicaWaitS * 1000,
        onTimeout: replicaTimeout(sk, id, o.replicaWaitS),
        signal: o.signal,
        clock: o.clock,
      });
      if (r.kind === 'closed') return closed(reply);
      if (r.kind === 'ready') return reply.send({ status: 'ok' });
      logger.warn({ ...what, reason: r.reason }, 'replica not ready: registration undone');
      await undo(what, (cur) => {
        const svc = findService(cur, project, run);
        const now: Replica | undefined = svc?.replicas.find((x) => x.id === id);
        if (svc === undefined || now === undefined || !isDeepStrictEqual(now, written)) return { kind: 'same' };
        return applyCall(cur, { kind: 'unregisterReplica', project, run, jobId: id });
      });
      return detail(reply, 400, cannotRegisterReplica(id, project, run, r.reason));
    }

    if (call.kind === 'registerService') {
      const { project } = call;
      const run = call.body.run_name.toLowerCase();
      const written = findService(answer.state, project, run);
      if (written?.domain && (await newDomain(answer, written.domain, o.sites?.byHost(written) ?? false, what)) === 'closed') {
        return closed(reply);
      }
      if (o.tls === 'wait' && written?.https && written.domain) {
        const r = await certificate(written.domain, answer.generation);
        if (r === 'closed') return closed(reply);
        if (!r.ok) {
          logger.warn({ ...what, domain: written.domain }, 'no certificate: service registration undone');
          const previous = answer.changed ? findService(answer.previous, project, run) : undefined;
          await undo(what, (cur) => {
            const now = findService(cur, project, run);
            if (now === undefined || !isDeepStrictEqual(now, written)) return { kind: 'same' };
            const others = cur.spec.services.filter((s) => s !== now);
            return withServices(cur, previous ? [...others, previous] : others);
          });
          return detail(reply, 400, r.text);
        }
      }
    }

    if (call.kind === 'registerEntrypoint') {
      const { project } = call;
      const written = findEntrypoint(answer.state, project);
      if (written && (await newDomain(answer, written.domain, false, what)) === 'closed') return closed(reply);
      if (o.tls === 'wait' && written?.https) {
        const r = await certificate(written.domain, answer.generation);
        if (r === 'closed') return closed(reply);
        if (!r.ok) {
          logger.warn({ ...what, domain: written.domain }, 'no certificate: entrypoint registration undone');
          const previous = answer.changed ? findEntrypoint(answer.previous, project) : undefined;
          await undo(what, (cur) => {
            const now = findEntrypoint(cur, project);
            if (now === undefined || !isDeepStrictEqual(now, written)) return { kind: 'same' };
            const entrypoints = [...cur.spec.entrypoints.filter((e) => e !== now), ...(previous ? [previous] : [])];
            return { kind: 'changed', state: { ...cur, spec: { ...cur.spec, entrypoints } } };
          });
          return detail(reply, 400, r.text);
        }
      }
    }
    return reply.send({ status: 'ok' });
  };

  app.get('/', async () => ({ version: o.version, implementation: 'dstack-proxy' }));

  await app.register(
    async (scope) => {
      fastApiShapes(scope, logger);
      scope.post('/', (req, reply) => handle('config', req, reply, true));
    },
    { prefix: '/api/config' },
  );

  await app.register(
    async (scope) => {
      fastApiShapes(scope, logger);
      scope.get('/list', async () => listServices((await o.read()).state));
    },
    { prefix: '/api/services' },
  );

  await app.register(
    async (scope) => {
      fastApiShapes(scope, logger);
      scope.post('/:project/services/register', (req, reply) => handle('registerService', req, reply, true));
      scope.post('/:project/services/:run/unregister', (req, reply) => handle('unregisterService', req, reply, false));
      scope.post('/:project/services/:run/set_id', (req, reply) => handle('setServiceId', req, reply, true));
      scope.post('/:project/services/:run/replicas/register', (req, reply) => handle('registerReplica', req, reply, true));
      scope.post('/:project/services/:run/replicas/:jobId/unregister', (req, reply) => handle('unregisterReplica', req, reply, false));
      scope.post('/:project/entrypoints/register', (req, reply) => handle('registerEntrypoint', req, reply, true));
    },
    { prefix: '/api/registry' },
  );
}
