// The gateway end to end with TLS: an `https: true` service whose ACME server is a local Pebble.
// startGateway() runs certbot (REQUESTS_CA_BUNDLE = Pebble's listener CA), Nginx serves the
// issued certificate on the HTTPS port (chain verified against Pebble's root, no
// rejectUnauthorized: false), remote HTTP is redirected, and the status API says Ready.

import type { Server } from 'node:http';
import { connect } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { startPebble, type TestPebble } from '../helpers/pebble.js';
import { freePort } from '../helpers/ports.js';
import { call, directReplica, integrationDoc, startGatewayWith } from './integration-harness.js';

const DOMAIN = 'secure.gw.test';

let pebble: TestPebble;
let t: TestGateway;
let echo: Server;
let root: string;

interface Condition {
  type: string;
  status: string;
  reason: string;
  message: string;
}
interface StatusBody {
  loops: Record<string, { objects: Record<string, { conditions: Condition[] }> }>;
}

beforeAll(async () => {
  pebble = await startPebble();
  const port = await freePort();
  echo = await startEcho('secure', { port });
  t = await startGatewayWith(
    { acmeCaBundle: pebble.caPath, certbotTimeout: '60' },
    // Test domains are not in DNS: the pre-flight resolves everything to loopback.
    { resolve: async () => ['127.0.0.1'] },
  );
  const doc = integrationDoc({
    acmeServer: pebble.directoryUrl,
    services: [{ run: 'secure', domain: DOMAIN, https: true, replicas: [directReplica('secure-r0', port)] }],
  });
  const r = await putState(t, doc);
  expect(r.status).toBe(200);
  root = await pebble.rootPem();
});

afterAll(async () => {
  await t?.cleanup();
  if (echo) await close(echo);
  await pebble?.destroy();
});

/** Once the certificate is served: the HTTPS answer, verified against Pebble's root. */
async function httpsReady() {
  return eventually(async () => {
    const r = await call({ port: t.httpsPort, host: DOMAIN, ca: root }).catch(() => undefined);
    return r?.status === 200 ? r : undefined;
  }, 90_000);
}

describe('TLS through certbot and Pebble', () => {
  it('issues a certificate and Nginx serves it with a chain that verifies against the ACME root', async () => {
    const r = await httpsReady();
    expect((JSON.parse(r.body) as { name: string }).name).toBe('secure');
    const peer = await new Promise<{ subjectaltname: string; issuer: string; authorized: boolean }>((resolve, reject) => {
      const s = connect({ host: '127.0.0.1', port: t.httpsPort, servername: DOMAIN, ca: root }, () => {
        const c = s.getPeerCertificate();
        resolve({ subjectaltname: c.subjectaltname ?? '', issuer: String(c.issuer.CN), authorized: s.authorized });
        s.end();
      });
      s.on('error', reject);
    });
    expect(peer.authorized).toBe(true);
    expect(peer.subjectaltname).toContain(`DNS:${DOMAIN}`);
    expect(peer.issuer).toMatch(/Pebble/);
  });

  it('refuses a client that trusts only the system roots', async () => {
    await httpsReady();
    const err = await new Promise<Error>((resolve) => {
      const s = connect({ host: '127.0.0.1', port: t.httpsPort, servername: DOMAIN }, () => {
        s.end();
        resolve(new Error('the handshake succeeded'));
      });
      s.on('error', resolve);
    });
    expect((err as NodeJS.ErrnoException).code).toMatch(/CERT|ISSUER/);
  });

  it('redirects plain HTTP from a remote address to the HTTPS port', async () => {
    await httpsReady();
    const r = await call({ port: t.httpPort, host: DOMAIN, path: '/v1/models?x=1', localAddress: '127.0.0.2' });
    expect(r.status).toBe(301);
    expect(r.headers.location).toBe(`https://${DOMAIN}:${t.httpsPort}/v1/models?x=1`);
  });

  it('reports the certificate Ready in GET /api/v1/status', async () => {
    await httpsReady();
    const ready = await eventually(async () => {
      const r = await api(t, { path: '/api/v1/status' });
      const conditions = (r.json as StatusBody).loops.tls?.objects[DOMAIN]?.conditions;
      const c = conditions?.find((x) => x.type === 'Ready');
      return c?.status === 'True' ? c : undefined;
    }, 30_000);
    expect(ready.reason).toBe('Issued');
    expect(ready.message).toMatch(/^serial [0-9A-F]+; notAfter /);
  });
});
