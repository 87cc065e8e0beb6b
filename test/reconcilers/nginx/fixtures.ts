// Sample normalised documents for the Nginx tests.

import { API_VERSION, KIND, type ProxyState, type Service } from '../../../src/spec/types.js';

export function service(over: Partial<Service> & { run: string }): Service {
  return {
    project: 'main',
    https: false,
    auth: false,
    clientMaxBodySize: 64 * 1024 * 1024,
    stripPrefix: true,
    rateLimits: [],
    replicas: [],
    ...over,
  };
}

/** Several services covering every feature, plus an entrypoint. */
export function sampleState(backendPort = 18001): ProxyState {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.test/dir' },
      projects: [{ name: 'main' }],
      services: [
        service({
          run: 'llama-8b',
          domain: 'llama-8b.gw.test',
          https: true,
          auth: true,
          clientMaxBodySize: 1048576,
          rateLimits: [
            { prefix: '/', key: { type: 'ipAddress' }, rps: 10, burst: 20 },
            { prefix: '/v1/chat', key: { type: 'ipAddress' }, rps: 2.5, burst: 5 },
            { prefix: '/v1/chat', key: { type: 'header', header: 'X-Api-Key' }, rps: 0.1, burst: 0 },
          ],
          model: { name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/v1' },
          replicas: [
            { id: 'r1', appPort: 8000, direct: { host: '127.0.0.1', port: backendPort } },
            { id: 'r2', appPort: 8000, ssh: { host: '203.0.113.7', port: 22, user: 'ubuntu' } },
          ],
        }),
        service({ run: 'empty', domain: 'empty.gw.test', replicas: [] }),
        service({ run: 'internal', replicas: [{ id: 'r3', appPort: 8000, direct: { host: '127.0.0.1', port: backendPort } }] }),
        service({
          run: 'plain',
          domain: 'plain.gw.test',
          replicas: [{ id: 'r4', appPort: 8000, direct: { host: '127.0.0.1', port: backendPort } }],
        }),
      ],
      entrypoints: [{ project: 'main', domain: 'gateway.gw.test', https: true }],
    },
  };
}
