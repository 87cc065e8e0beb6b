// Two balancers on one socket dir, as two gateway processes in a hand-over: the shared path is
// a link to the serving one's socket; publish() moves it with one rename; the old one answers
// each next request on its open connections with Connection: close and closes once they are
// gone. Real HTTP replicas on 127.0.0.1, raw bytes on the socket.

import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Balancer, liveDataPlane, Replicas, SERVICE_HEADER } from '../../src/dataplane/index.js';
import { tcpUpstream } from '../helpers/replicas.js';
import { tmpDir } from '../helpers/tmp.js';

let tmp: ReturnType<typeof tmpDir>;
let replica: Server;
let port: number;

beforeAll(async () => {
  tmp = tmpDir('dp-handover-');
  replica = createServer((req, res) => res.end(`seen ${req.url}`));
  await new Promise<void>((r) => replica.listen(0, '127.0.0.1', r));
  port = (replica.address() as { port: number }).port;
});

afterAll(async () => {
  replica?.closeAllConnections();
  await new Promise((r) => replica?.close(r));
  tmp?.cleanup();
});

function gateway(name: string, handOver: boolean, socketDir: string): { replicas: Replicas; balancer: Balancer; name: string } {
  const replicas = new Replicas();
  replicas.set('p/svc', name, tcpUpstream(port));
  return { replicas, balancer: new Balancer({ socketDir, replicas, shared: true, handOver }), name };
}

const get = (path: string, extra = ''): string => `GET ${path} HTTP/1.1\r\nHost: svc\r\n${SERVICE_HEADER}: p/svc\r\n${extra}\r\n`;

/** One keep-alive connection: send, and read until `n` answers (Content-Length bodies) or the close. */
class Conn {
  readonly sock: Socket;
  text = '';
  closed = false;
  constructor(path: string) {
    this.sock = connect({ path });
    this.sock.on('data', (d: Buffer) => (this.text += d.toString('latin1')));
    this.sock.on('error', () => undefined);
    this.sock.once('close', () => (this.closed = true));
  }
  async send(bytes: string, answers: number): Promise<string> {
    const from = this.text.length;
    this.sock.write(bytes);
    const until = Date.now() + 10_000;
    while ((this.text.slice(from).match(/\r\n\r\nseen \/\w+/g) ?? []).length < answers) {
      if (Date.now() > until) throw new Error(`no answer; got ${this.text.slice(from)}`);
      await new Promise((r) => setTimeout(r, 5));
    }
    return this.text.slice(from);
  }
}

describe('a hand-over between two balancers on one socket dir', () => {
  it('moves new connections with one rename, and the old one drains the connections it has', async () => {
    const dir = join(tmp.dir, 'moves');
    const old = gateway('old', false, dir);
    expect(await old.balancer.listenAll(['p/svc'])).toEqual(new Map());
    const path = old.balancer.sharedSocketPath!;
    expect(await liveDataPlane(dir)).toEqual({ pid: process.pid });
    const before = new Conn(path);
    expect(await before.send(get('/one'), 1)).toMatch(/^HTTP\/1\.1 200 OK\r\n(?![\s\S]*Connection: close)/);

    // The new one binds beside it; until it publishes, connections still reach the old one.
    const next = gateway('next', true, dir);
    expect(await next.balancer.listenAll(['p/svc'])).toEqual(new Map());
    const early = new Conn(path);
    await early.send(get('/early'), 1);
    expect(old.balancer.stats.requests).toBe(2);
    expect(next.balancer.stats.requests).toBe(0);
    await next.balancer.publish();
    const after = new Conn(path);
    await after.send(get('/after'), 1);
    expect(next.balancer.stats.requests).toBe(1);

    // The old one, told to stop: its open connections' next answers close them, and it is done
    // once they have closed, long before the drain period.
    const started = Date.now();
    const closing = old.balancer.close({ drainMs: 30_000 });
    await new Promise((r) => setTimeout(r, 50));
    expect(await before.send(get('/last'), 1)).toContain('Connection: close\r\n');
    expect(await early.send(get('/last'), 1)).toContain('Connection: close\r\n');
    await closing;
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(before.closed && early.closed).toBe(true);
    // The link stays with the new one, and the old one's socket dir is gone.
    expect(readdirSync(join(dir, 'instances'))).toHaveLength(1);
    expect(await after.send(get('/still'), 1)).not.toContain('Connection: close');
    after.sock.destroy();

    // A plain stop of the one serving removes the link: nothing accepts there any more.
    await next.balancer.close();
    expect(existsSync(path)).toBe(false);
    expect(await liveDataPlane(dir)).toBeUndefined();
    await Promise.all([old.replicas.close(), next.replicas.close()]);
  });

  it('cuts what is still open when the drain period ends', async () => {
    const dir = join(tmp.dir, 'cuts');
    const old = gateway('old', false, dir);
    await old.balancer.listenAll(['p/svc']);
    const idle = new Conn(old.balancer.sharedSocketPath!);
    await idle.send(get('/idle'), 1);
    const next = gateway('next', true, dir);
    await next.balancer.listenAll(['p/svc']);
    await next.balancer.publish();
    const started = Date.now();
    await old.balancer.close({ drainMs: 300 });
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    await new Promise((r) => setTimeout(r, 50));
    expect(idle.closed).toBe(true);
    await next.balancer.close();
    await Promise.all([old.replicas.close(), next.replicas.close()]);
  });

  it('removes the dirs of processes gone, and keeps a live one', async () => {
    const dir = join(tmp.dir, 'stale');
    const a = gateway('a', false, dir);
    await a.balancer.listenAll(['p/svc']);
    // A crash leaves a dir whose socket nothing accepts on.
    mkdirSync(join(dir, 'instances', '999999.1'), { recursive: true });
    writeFileSync(join(dir, 'instances', '999999.1', 'dataplane.sock'), '');
    const b = gateway('b', true, dir);
    await b.balancer.listenAll(['p/svc']);
    expect(readdirSync(join(dir, 'instances'))).toHaveLength(2);
    expect(readdirSync(join(dir, 'instances')).some((n) => n.startsWith('999999.'))).toBe(false);
    await b.balancer.close();
    await a.balancer.close();
    await Promise.all([a.replicas.close(), b.replicas.close()]);
  });
});
