// PUT/GET /api/v1/state — shared by the gateway and the in-server proxy.

import type { FastifyInstance, FastifyRequest } from 'fastify';
import { stringify } from 'yaml';
import { ProxyError } from '../errors.js';
import {
  MAX_DOCUMENT_BYTES,
  SpecError,
  diffSpecs,
  hashSpec,
  parseDocument,
  redact,
  shareUnchanged,
  validate,
  type DocumentFormat,
  type ProxyState,
} from '../spec/index.js';
import type { Plan, Runtime } from './runtime.js';

const YAML_TYPES = ['application/yaml', 'application/x-yaml', 'text/yaml', 'text/x-yaml'];
const JSON_TYPES = ['application/json'];

export interface StateRoutesOptions {
  runtime: Runtime;
  guard: (request: FastifyRequest) => Promise<void>;
}

export async function stateRoutes(app: FastifyInstance, { runtime, guard }: StateRoutesOptions): Promise<void> {
  // Our own parser sees the raw text, so YAML and JSON get the same limits and messages.
  // Only JSON and YAML: fastify's default text/plain parser would take a JSON body too.
  app.removeContentTypeParser(['application/json', 'text/plain']);
  app.addContentTypeParser([...JSON_TYPES, ...YAML_TYPES], { parseAs: 'string', bodyLimit: MAX_DOCUMENT_BYTES }, (_req, body, done) =>
    done(null, body),
  );

  app.put<{ Querystring: { dryRun?: string } }>('/api/v1/state', { onRequest: guard }, async (request) => {
    const format: DocumentFormat = YAML_TYPES.some((t) => (request.headers['content-type'] ?? '').startsWith(t)) ? 'yaml' : 'json';
    // The content parsers hand the body over as text; nothing else reaches here.
    const parsed = parseAndValidate(typeof request.body === 'string' ? request.body : '', format);
    const ifMatch = parseIfMatch(request.headers['if-match']);
    const dryRun = request.query.dryRun === 'true' || request.query.dryRun === '1';

    const current = await runtime.store.read();
    // The services this PUT leaves as they were keep their stored objects: work and memory
    // after it follow what changed, not the size of the document.
    const next = shareUnchanged(parsed, current.state);
    if (ifMatch !== undefined && ifMatch !== current.generation) {
      throw new ProxyError('DP_ERR_GENERATION_MISMATCH', `If-Match is ${ifMatch}; the current generation is ${current.generation}`, {
        generation: current.generation,
      });
    }
    // An identical document is a no-op: no write, no trigger. The loops' own resync still
    // repairs drift. A dry run still plans it: its actions then show that drift.
    const same = hashSpec(next) === current.hash;
    if (same && !dryRun) return { generation: current.generation, hash: current.hash, changed: false, plan: emptyPlan() };
    // What each loop would do (its observe and plan, Nginx diffs included) is what a dry run
    // is for. An applying PUT answers with the document's changes alone: the pass that follows
    // observes and plans once, and status shows what it did.
    if (dryRun)
      return {
        generation: current.generation,
        hash: current.hash,
        changed: !same,
        dryRun: true,
        plan: await runtime.plan(next, current.state),
      };
    const plan: Plan = { document: diffSpecs(current.state, next), loops: {} };
    const result = await runtime.store.write(next, ifMatch === undefined ? {} : { ifMatch });
    // The store's watch has already handed the new generation to the loops.
    if (result.changed) {
      request.log.info(
        { generation: result.generation, hash: result.hash, changes: plan.document.changes.length },
        'new generation stored',
      );
    }
    return { generation: result.generation, hash: result.hash, changed: result.changed, plan };
  });

  app.get('/api/v1/state', { onRequest: guard }, async (request, reply) => {
    const s = await runtime.store.read();
    const doc = withMetadata(redact(s.state), s.generation, s.hash, s.updatedAt);
    reply.header('etag', `"${s.generation}"`);
    if ((request.headers.accept ?? '').split(',').some((t) => YAML_TYPES.includes(t.trim().split(';')[0]!))) {
      return reply.type('application/yaml').send(stringify(doc));
    }
    return doc;
  });
}

function withMetadata(state: ProxyState, generation: number, hash: string, updatedAt: string): Record<string, unknown> {
  return { apiVersion: state.apiVersion, kind: state.kind, metadata: { generation, hash, updatedAt }, spec: state.spec };
}

function parseAndValidate(text: string, format: DocumentFormat): ProxyState {
  let raw: unknown;
  try {
    raw = parseDocument(text, format);
  } catch (err) {
    if (err instanceof SpecError) {
      const code = err.kind === 'too-large' ? 'DP_ERR_DOCUMENT_TOO_LARGE' : 'DP_ERR_MALFORMED_DOCUMENT';
      throw new ProxyError(code, err.issues[0]?.message, { errors: err.issues });
    }
    throw err;
  }
  return validateDocument(raw);
}

/**
 * A parsed document as every writer of the store must check it (this PUT, and the dstack
 * compatibility routes' candidates): schema and semantics, then normalised. Invalid: a
 * DP_ERR_INVALID_DOCUMENT whose `errors` list every issue.
 */
export function validateDocument(raw: unknown): ProxyState {
  const result = validate(raw);
  if (!result.ok) {
    throw new ProxyError('DP_ERR_INVALID_DOCUMENT', `the document has ${result.errors.length} error(s)`, { errors: result.errors });
  }
  return result.state;
}

/** `If-Match: 3`, `"3"` or `W/"3"` → 3. */
export function parseIfMatch(header: string | string[] | undefined): number | undefined {
  if (header === undefined) return undefined;
  const value = (Array.isArray(header) ? header[0] : header)
    ?.trim()
    .replace(/^W\//, '')
    .replace(/^"(.*)"$/, '$1');
  if (value === undefined || !/^\d{1,15}$/.test(value)) {
    throw new ProxyError('DP_ERR_BAD_IF_MATCH', `If-Match must be a generation number; got ${JSON.stringify(header)}`);
  }
  return Number(value);
}

function emptyPlan(): Plan {
  return { document: { changes: [], added: 0, removed: 0, changed: 0 }, loops: {} };
}
