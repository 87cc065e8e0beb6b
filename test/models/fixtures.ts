// A fastify app with the model API over stand-in replicas, and a document describing them.

import type { Duplex } from 'node:stream';
import Fastify, { type FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import type { AuthDecision } from '../../src/auth/index.js';
import { Replicas, type ReplicaRouter } from '../../src/dataplane/index.js';
import { replicaForwarder } from '../../src/models/forwarders.js';
import type { Forwarder } from '../../src/models/types.js';
import { memoryFirstSeenStore, type FirstSeenStore } from '../../src/models/first-seen.js';
import { registerModelApi } from '../../src/models/plugin.js';
import { tcpUpstream } from '../helpers/replicas.js';
import { API_VERSION, KIND, type ProxyState, type Service } from '../../src/spec/types.js';

export const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

function service(project: string, run: string, model: Service['model'], port?: number): Service {
  return {
    project,
    run,
    domain: `${run}.gw.test`,
    https: false,
    auth: true,
    clientMaxBodySize: 1 << 20,
    stripPrefix: true,
    rateLimits: [],
    model,
    replicas: port === undefined ? [] : [{ id: `${run}-r1`, appPort: port, direct: { host: '127.0.0.1', port } }],
  };
}

export function documentFor(ports: { openai: number; tgi: number }, tgiTemplate = CHATML): ProxyState {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.invalid/dir' },
      projects: [{ name: 'main' }, { name: 'other' }],
      services: [
        service('main', 'oa', { name: 'org/oa-model', format: 'openai', prefix: '/v1' }, ports.openai),
        service('main', 'tg', { name: 'tgi-model', format: 'tgi', chatTemplate: tgiTemplate, eosToken: '<|im_end|>' }, ports.tgi),
        service('main', 'idle', { name: 'a-idle-model', format: 'openai', prefix: '/v1' }),
        service('other', 'x', { name: 'other-model', format: 'openai', prefix: '/v1' }, ports.openai),
      ],
      entrypoints: [],
    },
  };
}

/**
 * Reaches a replica by TCP at the port its document entry names, through a real data plane
 * (Replicas): each service gets one replica, Ready while the current document gives it an address.
 */
export function directForwarder(getState: () => ProxyState): Forwarder {
  const replicas = new Replicas();
  const target = (key: string): { host: string; port: number } | undefined =>
    getState().spec.services.find((x) => `${x.project}/${x.run}` === key)?.replicas[0]?.direct;
  const known = new Set<string>();
  const ensure = (key: string): void => {
    if (known.has(key)) return;
    known.add(key);
    const ready = (): boolean => target(key) !== undefined;
    const open = (): Promise<Duplex> => {
      const t = target(key);
      if (!t) return Promise.reject(new Error(`${key} has no address`));
      return tcpUpstream(t.port, t.host).open();
    };
    replicas.set(key, `${key}#0`, { isReady: ready, open });
  };
  const router: ReplicaRouter = {
    dispatch: (key, req, handler) => (ensure(key), replicas.dispatch(key, req, handler)),
    open: (key) => (ensure(key), replicas.open(key)),
  };
  const f = replicaForwarder(router);
  return { forward: (service, req) => f.forward(service, req), close: () => replicas.close() };
}

export interface ApiHarness {
  app: FastifyInstance;
  baseUrl: string;
  state: { current: ProxyState };
  firstSeen: FirstSeenStore;
  client(token?: string, project?: string): OpenAI;
  close(): Promise<void>;
}

export async function startApi(
  state: ProxyState,
  opts: {
    authorize?: (p: string, t: string) => Promise<AuthDecision>;
    forwarder?: Forwarder;
    now?: () => number;
    firstSeen?: FirstSeenStore;
  } = {},
): Promise<ApiHarness> {
  const holder = { current: state };
  const forwarder = opts.forwarder ?? directForwarder(() => holder.current);
  const firstSeen = opts.firstSeen ?? memoryFirstSeenStore();
  const app = Fastify();
  await registerModelApi(app, {
    prefix: '/api/models/:project',
    getState: () => holder.current,
    authorize: opts.authorize ?? (async (p, t) => (t === 'good' && (p === 'main' || p === 'other') ? 'allow' : 'deny')),
    forward: (s, r) => forwarder.forward(s, r),
    clock: { now: opts.now ?? (() => Date.UTC(2025, 0, 1)) },
    firstSeen,
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  const baseUrl = `http://127.0.0.1:${port}`;
  return {
    app,
    baseUrl,
    state: holder,
    firstSeen,
    client: (token = 'good', project = 'main') => new OpenAI({ apiKey: token, baseURL: `${baseUrl}/api/models/${project}`, maxRetries: 0 }),
    close: async () => {
      await app.close();
      await forwarder.close();
    },
  };
}
