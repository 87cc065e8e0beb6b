// dstack's replicated gateways (each replica registered on its own, no shared database) behind
// one name: each runs certbot for the shared domain, and the CA's validation may reach any of
// them. With --acme-challenge-peers a replica that does not have the challenge file asks the
// others. Three gateways (private Nginx each) behind a round-robin TCP front on 127.0.0.1, and
// Pebble really validating through that front (its DNS answering 127.0.0.1): each replica
// gets its certificate. A challenge file one replica holds is answered by another's Nginx, and
// a peer's own question is never passed on.

import { mkdirSync, writeFileSync } from 'node:fs';
import type { Server } from 'node:http';
import { connect, createServer, type Server as NetServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, putState, type TestGateway } from '../helpers/gateway.js';
import { close, startEcho } from '../helpers/http.js';
import { eventually } from '../helpers/nginx.js';
import { freePort, freePorts } from '../helpers/ports.js';
import { startPebble, type TestPebble } from '../helpers/pebble.js';
import { call, directReplica, integrationDoc, startGatewayWith } from './integration-harness.js';

const DOMAIN = 'replicated.gw.test';
let pebble: TestPebble;
let front: NetServer;
let echo: Server;
const replicas: TestGateway[] = [];
/** Each replica's HTTP port (its Nginx). */
let httpPorts: number[];
/** Connections the front passed on: the CA's validations. */
let validations = 0;

beforeAll(async () => {
  const frontPort = await freePort();
  pebble = await startPebble({ validateAt: frontPort });
  httpPorts = await freePorts(3);
  // The round-robin front: connection n goes to replica n mod 3.
  let n = 0;
  front = createServer((client) => {
    validations++;
    const upstream = connect(httpPorts[n++ % httpPorts.length]!, '127.0.0.1');
    client.pipe(upstream).pipe(client);
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  await new Promise<void>((r) => front.listen(frontPort, '127.0.0.1', r));
  const echoPort = await freePort();
  echo = await startEcho('replicated', { port: echoPort });
  for (const [i, httpPort] of httpPorts.entries()) {
    const peers = httpPorts.filter((_, j) => j !== i).map((p) => `http://127.0.0.1:${p}`);
    replicas.push(
      await startGatewayWith(
        { httpPort: String(httpPort), acmeCaBundle: pebble.caPath, certbotTimeout: '60', acmeChallengePeers: peers.join(',') },
        { resolve: async () => ['127.0.0.1'] },
      ),
    );
  }
  // dstack registers the same service on every replica.
  const doc = integrationDoc({
    acmeServer: pebble.directoryUrl,
    services: [{ run: 'replicated', domain: DOMAIN, https: true, replicas: [directReplica('r0', echoPort)] }],
  });
  for (const g of replicas) {
    const r = await putState(g, doc);
    expect(r.status, r.body).toBe(200);
  }
}, 120_000);

afterAll(async () => {
  for (const g of replicas) await g.cleanup();
  await new Promise((r) => front?.close(r));
  if (echo) await close(echo);
  await pebble?.destroy();
});

interface Condition {
  type: string;
  status: string;
  reason: string;
}

describe('--acme-challenge-peers', () => {
  it("answers a challenge file another replica holds, from this replica's Nginx", async () => {
    const token = 'tok_' + 'a'.repeat(40);
    const webroot = join(replicas[0]!.gw.paths.acmeWebroot, '.well-known', 'acme-challenge');
    mkdirSync(webroot, { recursive: true });
    writeFileSync(join(webroot, token), `${token}.thumbprint_0123456789`);
    const r = await call({ port: httpPorts[2]!, host: DOMAIN, path: `/.well-known/acme-challenge/${token}` });
    expect(r.status, r.body).toBe(200);
    expect(r.body).toBe(`${token}.thumbprint_0123456789`);
    // A peer's own question is answered from the webroot alone: never passed on.
    const asked = await call({
      port: httpPorts[2]!,
      host: DOMAIN,
      path: `/.well-known/acme-challenge/${token}`,
      headers: { 'x-dstack-proxy-acme-peer': '1' },
    });
    expect(asked.status).toBe(404);
    // Nobody has it: 404, and a token that is not base64url is not asked about.
    expect((await call({ port: httpPorts[1]!, host: DOMAIN, path: '/.well-known/acme-challenge/unknown_token' })).status).toBe(404);
    expect((await call({ port: httpPorts[1]!, host: DOMAIN, path: '/.well-known/acme-challenge/a%2Fb' })).status).toBe(404);
  });

  it('lets every replica get its certificate through a CA that validates through the round-robin front', async () => {
    for (const g of replicas) {
      const ready = await eventually(async () => {
        const s = (await api(g, { path: '/api/v1/status' })).json as {
          loops: Record<string, { objects: Record<string, { conditions: Condition[] }> }>;
        };
        const c = s.loops.tls?.objects[DOMAIN]?.conditions.find((x) => x.type === 'Ready');
        return c?.status === 'True' ? c : undefined;
      }, 150_000);
      expect(ready.reason).toBe('Issued');
    }
    // The CA asked through the front (one connection per validation at least), so two of three
    // validations on average reached a replica that did not hold the token.
    expect(validations).toBeGreaterThanOrEqual(3);
    console.log(`3 replicas behind one name got their certificates; the CA connected ${validations} times through the front`);
  }, 200_000);

  // Last: the CA validates through the same loopback address, and is held the same way.
  it('holds a client sending made-up tokens to a few questions a second (429 past a burst of 20)', async () => {
    // All at once: 20 pass at once, then 10 a second; 60 arrive far faster than that.
    const codes = await Promise.all(
      Array.from(
        { length: 60 },
        async (_, i) => (await call({ port: httpPorts[0]!, host: DOMAIN, path: `/.well-known/acme-challenge/made_up_${i}` })).status,
      ),
    );
    expect(codes.filter((c) => c === 404).length).toBeGreaterThanOrEqual(20);
    expect(codes).toContain(429);
    expect(codes.every((c) => c === 404 || c === 429)).toBe(true);
  });
});
