// dstack's request models as its gateway checks them: every payload the server sends parses,
// unknown fields are dropped, names are lower-cased where dstack's router lower-cases them, and
// a malformed request gets the errors FastAPI (pydantic v2) would list in its 422.

import { describe, expect, test } from 'vitest';
import { parseCall, type CallKind, type ParseResult, type PathParams } from '../../../src/compat/dstack/requests.js';
import type { Call } from '../../../src/compat/dstack/calls.js';
import {
  configPayload,
  dockerReplicaPayload,
  dstackId,
  entrypointPayload,
  headProxyReplicaPayload,
  headerRateLimit,
  ipRateLimit,
  pebbleConfigPayload,
  registerServicePayload,
  setIdPayload,
  tgiModel,
  vmReplicaPayload,
} from './fixtures.js';

const KEY = '-----BEGIN PRIVATE KEY-----\nnot parsed here\n-----END PRIVATE KEY-----\n';
const P: PathParams = { project: 'main', run: 'llama-svc' };

function ok(route: CallKind, params: PathParams, body: unknown): Call {
  const r = parseCall(route, params, body);
  if (!r.ok) throw new Error(`expected ok, got ${JSON.stringify(r.detail)}`);
  return r.call;
}

function detail(r: ParseResult): unknown[] {
  if (r.ok) throw new Error(`expected a 422, got ${JSON.stringify(r.call)}`);
  return r.detail;
}

describe('every payload the server sends', () => {
  test('config: nulls and a Pebble URL', () => {
    expect(ok('config', {}, configPayload())).toEqual({
      kind: 'config',
      body: { acme_server: null, acme_eab_kid: null, acme_eab_hmac_key: null },
    });
    const eab = { kid: 'kid-1', hmacKey: 'c2VjcmV0LWhtYWM' };
    expect(ok('config', {}, pebbleConfigPayload(undefined, eab))).toEqual({
      kind: 'config',
      body: { acme_server: 'https://127.0.0.1:14000/dir', acme_eab_kid: 'kid-1', acme_eab_hmac_key: 'c2VjcmV0LWhtYWM' },
    });
  });

  test('services/register with an openai model and rate limits: unknown fields dropped, names lower-cased', () => {
    const id = dstackId();
    const body = registerServicePayload({
      id,
      runName: 'Llama-Svc',
      domain: 'Llama-Svc.Main.Example.Test',
      sshPrivateKey: KEY,
      rateLimits: [ipRateLimit(), headerRateLimit('X-API-Key')],
    });
    expect(body.read_timeout).toBe(600); // the fixture carries a field a newer server might send
    expect(ok('registerService', { project: 'Main' }, body)).toEqual({
      kind: 'registerService',
      project: 'main',
      body: {
        id,
        run_name: 'llama-svc',
        domain: 'llama-svc.main.example.test',
        https: false,
        auth: true,
        client_max_body_size: 64 * 1024 * 1024,
        options: { openai: { model: { type: 'chat', name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/v1' } } },
        ssh_private_key: KEY,
        rate_limits: [
          { prefix: '/', key: { type: 'ip_address' }, rps: 2.5, burst: 5 },
          { prefix: '/v1/chat/completions', key: { type: 'header', header: 'X-API-Key' }, rps: 10, burst: 0 },
        ],
        has_router_replica: false,
        router: null,
      },
    });
  });

  test('services/register with a tgi model, a router replica, no model, or no id', () => {
    const tgi = ok('registerService', P, registerServicePayload({ sshPrivateKey: KEY, model: tgiModel(), hasRouterReplica: true }));
    expect(tgi.kind === 'registerService' && tgi.body.options.openai?.model).toEqual({
      type: 'chat',
      name: 'mistralai/Mistral-7B-Instruct-v0.2',
      format: 'tgi',
      chat_template: tgiModel().chat_template,
      eos_token: '</s>',
    });
    expect(tgi.kind === 'registerService' && tgi.body.has_router_replica).toBe(true);
    const bare = ok('registerService', P, registerServicePayload({ sshPrivateKey: KEY, model: null, id: null, extra: {} }));
    expect(bare.kind === 'registerService' && [bare.body.options, bare.body.id]).toEqual([{}, null]);
    // rate_limits, has_router_replica and router have defaults: a pre-0.21 server may leave them out.
    const { rate_limits: _r, has_router_replica: _h, ...minimal } = registerServicePayload({ sshPrivateKey: KEY });
    const min = ok('registerService', P, minimal);
    expect(min.kind === 'registerService' && [min.body.rate_limits, min.body.has_router_replica, min.body.router]).toEqual([
      [],
      false,
      null,
    ]);
  });

  test('a non-null router passes to the mapper (which refuses it with a sentence)', () => {
    const c = ok('registerService', P, { ...registerServicePayload({ sshPrivateKey: KEY }), router: { type: 'sglang' } });
    expect(c.kind === 'registerService' && c.body.router).toEqual({ type: 'sglang' });
  });

  test('replicas/register: VM, dockerized (ssh_proxy), head proxy; job_id untouched, project and run lower-cased', () => {
    const jobId = 'AbC' + dstackId().slice(3);
    const vm = ok('registerReplica', { project: 'Main', run: 'Llama-Svc' }, vmReplicaPayload({ jobId, sshPort: 2222 }));
    expect(vm).toEqual({
      kind: 'registerReplica',
      project: 'main',
      run: 'llama-svc',
      body: {
        job_id: jobId,
        app_port: 8000,
        ssh_host: 'ubuntu@127.0.0.1',
        ssh_port: 2222,
        ssh_proxy: null,
        ssh_proxy_private_key: null,
        ssh_head_proxy: null,
        ssh_head_proxy_private_key: null,
        internal_ip: '10.0.0.5',
      },
    });
    const docker = ok('registerReplica', P, dockerReplicaPayload({ vm: { port: 2200 } }));
    expect(docker.kind === 'registerReplica' && docker.body).toMatchObject({
      ssh_host: 'root@localhost',
      ssh_port: 10022,
      ssh_proxy: { hostname: '127.0.0.1', username: 'ubuntu', port: 2200 },
      ssh_proxy_private_key: null,
    });
    const head = ok('registerReplica', P, headProxyReplicaPayload({ headKey: KEY, head: { port: 2201 } }));
    expect(head.kind === 'registerReplica' && head.body).toMatchObject({
      ssh_host: 'ubuntu@10.0.1.7',
      ssh_head_proxy: { hostname: '127.0.0.1', username: 'ubuntu', port: 2201 },
      ssh_head_proxy_private_key: KEY,
    });
  });

  test('entrypoints/register, set_id and the bodiless unregisters', () => {
    expect(ok('registerEntrypoint', { project: 'Main' }, entrypointPayload({ domain: 'Gateway.Main.Example.Test', https: true }))).toEqual({
      kind: 'registerEntrypoint',
      project: 'main',
      body: { domain: 'gateway.main.example.test', https: true },
    });
    const id = dstackId();
    expect(ok('setServiceId', P, setIdPayload(id))).toEqual({ kind: 'setServiceId', project: 'main', run: 'llama-svc', id });
    expect(ok('unregisterService', { project: 'MAIN', run: 'Llama-Svc' }, undefined)).toEqual({
      kind: 'unregisterService',
      project: 'main',
      run: 'llama-svc',
    });
    expect(ok('unregisterReplica', { ...P, jobId: 'ABC' }, undefined)).toEqual({
      kind: 'unregisterReplica',
      project: 'main',
      run: 'llama-svc',
      jobId: 'ABC',
    });
  });
});

describe("pydantic's lax conversions", () => {
  test('numeric strings, integral numbers and boolean words are accepted', () => {
    const c = ok('registerReplica', P, { ...vmReplicaPayload(), app_port: '8001', ssh_port: 22.0 });
    expect(c.kind === 'registerReplica' && [c.body.app_port, c.body.ssh_port]).toEqual([8001, 22]);
    const e = ok('registerEntrypoint', P, { domain: 'gw.example.test', https: 'yes' });
    expect(e.kind === 'registerEntrypoint' && e.body.https).toBe(true);
    // dstack's SSH hop model coerces numbers to strings.
    const h = ok('registerReplica', P, { ...vmReplicaPayload(), ssh_proxy: { hostname: 1234, username: 'u', port: '22' } });
    expect(h.kind === 'registerReplica' && h.body.ssh_proxy).toEqual({ hostname: '1234', username: 'u', port: 22 });
  });
});

describe("FastAPI's 422 detail", () => {
  test('a missing body, or one that is not an object', () => {
    expect(detail(parseCall('registerEntrypoint', P, undefined))).toEqual([
      { type: 'missing', loc: ['body'], msg: 'Field required', input: null },
    ]);
    expect(detail(parseCall('config', {}, [1]))).toEqual([
      {
        type: 'model_attributes_type',
        loc: ['body'],
        msg: 'Input should be a valid dictionary or object to extract fields from',
        input: [1],
      },
    ]);
  });

  test('a missing required field names it, with the containing object as input', () => {
    const { run_name: _, ...body } = registerServicePayload({ sshPrivateKey: KEY, extra: {} });
    expect(detail(parseCall('registerService', P, body))).toEqual([
      { type: 'missing', loc: ['body', 'run_name'], msg: 'Field required', input: body },
    ]);
  });

  test('every mistyped field is listed, in field order', () => {
    const body = { ...vmReplicaPayload(), job_id: 7, app_port: '80a', ssh_port: 1.5, ssh_proxy: 'bastion' };
    expect(detail(parseCall('registerReplica', P, body))).toEqual([
      { type: 'string_type', loc: ['body', 'job_id'], msg: 'Input should be a valid string', input: 7 },
      {
        type: 'int_parsing',
        loc: ['body', 'app_port'],
        msg: 'Input should be a valid integer, unable to parse string as an integer',
        input: '80a',
      },
      {
        type: 'int_from_float',
        loc: ['body', 'ssh_port'],
        msg: 'Input should be a valid integer, got a number with a fractional part',
        input: 1.5,
      },
      {
        type: 'model_attributes_type',
        loc: ['body', 'ssh_proxy'],
        msg: 'Input should be a valid dictionary or object to extract fields from',
        input: 'bastion',
      },
    ]);
    expect(detail(parseCall('registerEntrypoint', P, { domain: 'x.test', https: 'maybe' }))).toEqual([
      { type: 'bool_parsing', loc: ['body', 'https'], msg: 'Input should be a valid boolean, unable to interpret input', input: 'maybe' },
    ]);
    expect(detail(parseCall('registerEntrypoint', P, { domain: 'x.test', https: null }))).toEqual([
      { type: 'bool_type', loc: ['body', 'https'], msg: 'Input should be a valid boolean', input: null },
    ]);
  });

  test('rate limits: the injection patterns and the key discriminator', () => {
    const body = registerServicePayload({
      sshPrivateKey: KEY,
      extra: {},
      rateLimits: [ipRateLimit({ prefix: '/a b' }), headerRateLimit('X Key')],
    });
    (body.rate_limits as unknown[]).push({ ...ipRateLimit(), key: { type: 'cookie' } }, { ...ipRateLimit(), key: {}, rps: 'fast' });
    expect(detail(parseCall('registerService', P, body))).toEqual([
      {
        type: 'string_pattern_mismatch',
        loc: ['body', 'rate_limits', 0, 'prefix'],
        msg: String.raw`String should match pattern '^/[^\s\\{}]*$'`,
        input: '/a b',
        ctx: { pattern: String.raw`^/[^\s\\{}]*$` },
      },
      {
        type: 'string_pattern_mismatch',
        loc: ['body', 'rate_limits', 1, 'key', 'header', 'header'],
        msg: "String should match pattern '^[a-zA-Z0-9-_]+$'",
        input: 'X Key',
        ctx: { pattern: '^[a-zA-Z0-9-_]+$' },
      },
      {
        type: 'union_tag_invalid',
        loc: ['body', 'rate_limits', 2, 'key'],
        msg: "Input tag 'cookie' found using 'type' does not match any of the expected tags: 'ip_address', 'header'",
        input: { type: 'cookie' },
        ctx: { discriminator: "'type'", tag: 'cookie', expected_tags: "'ip_address', 'header'" },
      },
      {
        type: 'union_tag_not_found',
        loc: ['body', 'rate_limits', 3, 'key'],
        msg: "Unable to extract tag using discriminator 'type'",
        input: {},
        ctx: { discriminator: "'type'" },
      },
      {
        type: 'float_parsing',
        loc: ['body', 'rate_limits', 3, 'rps'],
        msg: 'Input should be a valid number, unable to parse string as a number',
        input: 'fast',
      },
    ]);
    expect(detail(parseCall('registerService', P, { ...body, rate_limits: null }))).toEqual([
      { type: 'tuple_type', loc: ['body', 'rate_limits'], msg: 'Input should be a valid tuple', input: null },
    ]);
  });

  test('the model: format discriminator, the tagged variant in loc, the chat literal', () => {
    const withModel = (model: unknown): unknown => ({
      ...registerServicePayload({ sshPrivateKey: KEY, extra: {} }),
      options: { openai: { model } },
    });
    expect(detail(parseCall('registerService', P, withModel({ type: 'chat', name: 'm', format: 'vllm' })))).toEqual([
      {
        type: 'union_tag_invalid',
        loc: ['body', 'options', 'openai', 'model'],
        msg: "Input tag 'vllm' found using 'format' does not match any of the expected tags: 'tgi', 'openai'",
        input: { type: 'chat', name: 'm', format: 'vllm' },
        ctx: { discriminator: "'format'", tag: 'vllm', expected_tags: "'tgi', 'openai'" },
      },
    ]);
    const tgi = { type: 'embeddings', name: 'm', format: 'tgi', chat_template: '{{x}}' };
    expect(detail(parseCall('registerService', P, withModel(tgi)))).toEqual([
      {
        type: 'literal_error',
        loc: ['body', 'options', 'openai', 'model', 'tgi', 'type'],
        msg: "Input should be 'chat'",
        input: 'embeddings',
        ctx: { expected: "'chat'" },
      },
      { type: 'missing', loc: ['body', 'options', 'openai', 'model', 'tgi', 'eos_token'], msg: 'Field required', input: tgi },
    ]);
  });

  test('config: AnyHttpUrl', () => {
    expect(detail(parseCall('config', {}, configPayload({ acme_server: 'ftp://acme.example/dir' })))).toEqual([
      {
        type: 'url_scheme',
        loc: ['body', 'acme_server'],
        msg: "URL scheme should be 'http' or 'https'",
        input: 'ftp://acme.example/dir',
        ctx: { expected_schemes: "'http' or 'https'" },
      },
    ]);
    const bad = detail(parseCall('config', {}, configPayload({ acme_server: 'acme directory' })));
    expect(bad).toMatchObject([{ type: 'url_parsing', loc: ['body', 'acme_server'], input: 'acme directory' }]);
    expect(detail(parseCall('config', {}, configPayload({ acme_eab_kid: 5 as unknown as string })))).toEqual([
      { type: 'string_type', loc: ['body', 'acme_eab_kid'], msg: 'Input should be a valid string', input: 5 },
    ]);
  });

  test('a missing path parameter is reported before the body', () => {
    expect(detail(parseCall('setServiceId', { project: 'main' }, {}))).toEqual([
      { type: 'missing', loc: ['path', 'run_name'], msg: 'Field required', input: null },
      { type: 'missing', loc: ['body', 'id'], msg: 'Field required', input: {} },
    ]);
  });

  test('a hostile body never throws: prototype keys are plain unknown fields', () => {
    const body = JSON.parse('{"__proto__": {"domain": "evil.test"}, "constructor": 1, "https": true}') as unknown;
    expect(detail(parseCall('registerEntrypoint', P, body))).toEqual([
      { type: 'missing', loc: ['body', 'domain'], msg: 'Field required', input: body },
    ]);
  });
});
