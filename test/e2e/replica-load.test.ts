// Outstanding requests per replica through the gateway: a client → the private Nginx → the
// service's balancer socket → a real HTTP replica on 127.0.0.1 that holds the request. While it
// is held, GET /api/v1/status shows the replica's load and GET /metrics its in-flight gauge; once
// answered, the gauge is back to 0 and the request counted.

import { createServer, type Server, type ServerResponse } from 'node:http';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { eventually } from '../helpers/nginx.js';
import { api, gatewayDoc, GW_DOMAIN, putState, send, startTestGateway, type TestGateway } from '../helpers/gateway.js';

let t: TestGateway;
let replica: Server;
const held: ServerResponse[] = [];

beforeAll(async () => {
  replica = createServer((req, res) => {
    req.resume();
    req.on('end', () => (req.url === '/hold' ? held.push(res) : res.end('quick')));
  });
  const port = await new Promise<number>((r) => replica.listen(0, '127.0.0.1', () => r((replica.address() as { port: number }).port)));
  t = await startTestGateway();
  const put = await putState(t, gatewayDoc([{ run: 'load', ports: [port] }]));
  expect(put.status).toBe(200);
}, 120_000);

afterAll(async () => {
  for (const r of held.splice(0)) r.destroy();
  await t?.cleanup();
  replica?.closeAllConnections();
  await new Promise<void>((r) => (replica ? replica.close(() => r()) : r()));
});

const SERVICE = 'main/load';
const REPLICA = 'load-r0';

async function load(): Promise<{ inFlight: number; requests: number } | undefined> {
  const r = await api(t, { path: '/api/v1/status' });
  expect(r.status).toBe(200);
  const s = r.json as { loops: Record<string, { objects: Record<string, { load?: { inFlight: number; requests: number } }> }> };
  return s.loops.ssh?.objects[`${SERVICE}/${REPLICA}`]?.load;
}

async function metric(name: string): Promise<number | undefined> {
  const text = (await api(t, { path: '/metrics' })).body;
  const m = new RegExp(`^dstack_proxy_${name}\\{service="${SERVICE}",replica="${REPLICA}"\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

it('a held request: inFlight 1 in status and metrics; answered: 0, and requests_total counted it', async () => {
  expect(await load()).toEqual({ inFlight: 0, requests: 0 });
  expect(await metric('replica_requests_in_flight')).toBe(0);
  expect(await metric('replica_requests_total')).toBe(0);

  const answer = send({ port: t.httpPort, host: `load.${GW_DOMAIN}`, path: '/hold' });
  await eventually(async () => (held.length === 1 ? true : undefined), 20_000);
  expect(await load()).toEqual({ inFlight: 1, requests: 1 });
  const text = (await api(t, { path: '/metrics' })).body;
  expect(text).toContain(`dstack_proxy_replica_requests_in_flight{service="${SERVICE}",replica="${REPLICA}"} 1\n`);
  expect(await metric('replica_requests_total')).toBe(1);

  held.shift()!.end('done');
  expect(await answer).toMatchObject({ status: 200, body: 'done' });
  // Back to 0 once the answer ended (or, where a keep-alive connection to the replica is handed
  // over whole, once that idle connection closes): a bounded wait, never a timing assertion.
  await eventually(async () => ((await metric('replica_requests_in_flight')) === 0 ? true : undefined), 90_000);
  expect(await metric('replica_requests_total')).toBe(1);
  expect((await load())?.inFlight).toBe(0);
}, 150_000);
