// The model API's connections on the shared data-plane socket: an entrypoint site's request
// (SERVICE_HEADER model-api) hands the whole connection, bytes already read included, to the
// API's HTTP server; a later request on a connection that carried another, or a socket without
// a model API, is refused with a sentence. Raw bytes on a real socket, a real HTTP server.

import { createServer, type Server } from 'node:http';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, Replicas, SERVICE_HEADER } from '../../src/dataplane/index.js';
import { MODEL_API } from '../../src/dataplane/service-header.js';
import { tcpUpstream } from '../helpers/replicas.js';
import { tmpDir } from '../helpers/tmp.js';

let tmp: ReturnType<typeof tmpDir>;
let replica: Server;
let api: Server;
let replicas: Replicas;
let withApi: Balancer;
let without: Balancer;

beforeAll(async () => {
  tmp = tmpDir('dp-model-api-');
  replica = createServer((req, res) => res.end(`replica ${req.url}`));
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  replicas = new Replicas();
  replicas.set('main/svc', 'r', tcpUpstream((replica.address() as { port: number }).port));
  // The API's server: never listens, it only gets connections handed to it.
  api = createServer((req, res) => {
    let body = '';
    req.setEncoding('latin1');
    req.on('data', (d: string) => (body += d));
    req.on('end', () => res.end(`api ${req.method} ${req.url} ${body}`));
  });
  withApi = new Balancer({
    socketDir: `${tmp.dir}/a`,
    replicas,
    shared: true,
    modelApi: (socket, head) => {
      if (head.length > 0) socket.unshift(head);
      api.emit('connection', socket);
      socket.resume();
    },
  });
  without = new Balancer({ socketDir: `${tmp.dir}/b`, replicas, shared: true });
  for (const b of [withApi, without]) await b.listenAll(['main/svc']);
});

afterAll(async () => {
  for (const b of [withApi, without]) await b?.close();
  await replicas?.close();
  replica?.closeAllConnections();
  await new Promise((r) => replica?.close(r));
  api?.closeAllConnections();
  tmp?.cleanup();
});

/** Writes `parts` on one connection, one every 30 ms; resolves with all it read once closed. */
function exchange(path: string, parts: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = connect({ path });
    let got = '';
    c.setEncoding('latin1');
    c.on('data', (d: string) => (got += d));
    c.on('error', reject);
    c.on('close', () => resolve(got));
    void (async () => {
      for (const p of parts) {
        c.write(p);
        await new Promise((r) => setTimeout(r, 30));
      }
    })();
    setTimeout(() => c.end(), 30 * parts.length + 300);
  });
}

const modelRequest = (body: string, extra = ''): string =>
  `POST /api/models/main/chat/completions HTTP/1.1\r\nHost: models.test\r\n${SERVICE_HEADER}: ${MODEL_API}\r\n${extra}` +
  `Content-Length: ${body.length}\r\n\r\n`;

describe('the model API on the shared socket', () => {
  it('gets the whole connection: the head read here and a body that arrives later', async () => {
    const body = '{"model":"m","messages":[]}';
    const got = await exchange(withApi.sharedSocketPath!, [modelRequest(body), body.slice(0, 10), body.slice(10)]);
    expect(got).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(got).toContain(`api POST /api/models/main/chat/completions ${body}`);
  });

  it('is refused on a connection that carried another request first', async () => {
    const first = `GET /x HTTP/1.1\r\nHost: svc.test\r\n${SERVICE_HEADER}: main/svc\r\n\r\n`;
    const got = await exchange(withApi.sharedSocketPath!, [first, modelRequest('')]);
    expect(got).toContain('replica /x');
    expect(got).toMatch(/HTTP\/1\.1 400 Bad Request\r\n[\s\S]*the model API takes a connection of its own/);
    expect(got).not.toContain('api POST');
  });

  it('answers 503 where no model API is served', async () => {
    const got = await exchange(without.sharedSocketPath!, [modelRequest('')]);
    expect(got).toMatch(/^HTTP\/1\.1 503 Service Unavailable\r\n[\s\S]*the model API is not served on this socket/);
  });
});
