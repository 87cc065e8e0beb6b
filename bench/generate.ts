// Generated documents for benchmarks and large-document tests: N services × R replicas.

import type { ProxyStateInput } from '../src/spec/input.js';

export function generateDocument(services: number, replicas = 3, opts: { direct?: boolean } = {}): ProxyStateInput {
  const projects = 10;
  return {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: Array.from({ length: projects }, (_, p) => ({
        name: `project-${p}`,
        sshPrivateKey: '-----BEGIN OPENSSH PRIVATE KEY-----\nbench\n-----END OPENSSH PRIVATE KEY-----\n',
      })),
      services: Array.from({ length: services }, (_, i) => ({
        project: `project-${i % projects}`,
        run: `run-${i}`,
        domain: `run-${i}.gw.example.com`,
        https: false,
        auth: i % 2 === 0,
        rateLimits: i % 5 === 0 ? [{ prefix: '/v1', key: { type: 'ipAddress' as const }, rps: 10, burst: 20 }] : [],
        replicas: Array.from({ length: replicas }, (_, r) =>
          opts.direct
            ? { id: `r-${i}-${r}`, appPort: 8000, direct: { host: '127.0.0.1', port: 20000 + ((i * replicas + r) % 40000) } }
            : { id: `r-${i}-${r}`, appPort: 8000, ssh: { host: '127.0.0.1', port: 22, user: 'ubuntu' } },
        ),
      })),
    },
  };
}
