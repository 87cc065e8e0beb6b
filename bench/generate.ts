// Generated documents for benchmarks and large-document tests: N services × R replicas.

import type { ProxyStateInput } from '../src/spec/input.js';

/** A throwaway Ed25519 key (validation parses every private key), shared by all projects. */
const BENCH_KEY = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACDWnOHE9SAq6W1r8Uc7K9CnM1bYtJ1e4VCzZb1xmD/lvwAAAJgB5ywjAecs
IwAAAAtzc2gtZWQyNTUxOQAAACDWnOHE9SAq6W1r8Uc7K9CnM1bYtJ1e4VCzZb1xmD/lvw
AAAEBnoO3r/LK9ZhHp5jy/hKTbL1TgoM2DVJGUBpc8B76Dgdac4cT1ICrpbWvxRzsr0Kcz
Vti0nV7hULNlvXGYP+W/AAAAE2RzdGFjay1wcm94eS10ZXN0LWEBAg==
-----END OPENSSH PRIVATE KEY-----
`;

export function generateDocument(services: number, replicas = 3, opts: { direct?: boolean } = {}): ProxyStateInput {
  const projects = 10;
  return {
    apiVersion: 'proxy.dstack.ai/v1alpha1',
    kind: 'ProxyState',
    spec: {
      projects: Array.from({ length: projects }, (_, p) => ({
        name: `project-${p}`,
        sshPrivateKey: BENCH_KEY,
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
