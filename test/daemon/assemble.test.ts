// assemble()'s one cleanup stack: when a step fails midway (here: a listener whose port is
// taken), everything acquired before it is released, in reverse order — the store, the
// deferred resources, the loops (through the controller), the apps already built and
// listening — and a real gateway whose API port is taken leaves no private Nginx behind.

import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { assemble } from '../../src/daemon/assemble.js';
import { startServerProxy } from '../../src/daemon/server-proxy.js';
import { mainConfText } from '../../src/reconcilers/nginx/nginx-process.js';
import { nginxOfPrefix } from '../../src/reconcilers/nginx/procfs.js';
import type { AnyLoop } from '../../src/reconcilers/types.js';
import { openWatchedFileStore } from '../../src/state/watched-file-store.js';
import { startTestGateway } from '../helpers/gateway.js';
import { freePorts } from '../helpers/ports.js';
import { tmpDir } from '../helpers/tmp.js';

const t = tmpDir('dp-assemble-');
afterAll(() => t.cleanup());
const silent = pino({ level: 'silent' });

/** Holds 127.0.0.1:port until closed. */
function occupy(port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(port, '127.0.0.1', () => resolve(srv));
  });
}

/** Nothing listens on 127.0.0.1:port any more: we can bind it ourselves. */
async function free(port: number): Promise<boolean> {
  const srv = await occupy(port).catch(() => undefined);
  if (!srv) return false;
  await new Promise((r) => srv.close(r));
  return true;
}

describe('assemble: one cleanup stack', () => {
  it('a listener that cannot bind releases everything acquired before it, in reverse order', async () => {
    const [first, taken] = (await freePorts(2)) as [number, number];
    const holder = await occupy(taken);
    const released: string[] = [];
    const loop: AnyLoop = {
      name: 'probe',
      desired: () => null,
      observe: async () => null,
      plan: () => [],
      apply: async () => 'done',
      close: async () => void released.push('loop'),
    };
    try {
      const err = await assemble({
        logger: silent,
        store: async () => {
          const store = await openWatchedFileStore({ stateDir: join(t.dir, 'synthetic') });
          const close = store.close.bind(store);
          return Object.assign(store, { close: async () => (released.push('store'), close()) });
        },
        async loops(d) {
          d.defer(() => released.push('acquired with the loops'));
          return [loop];
        },
        async listeners(d) {
          d.defer(() => released.push('acquired with the routes'));
          return [
            {
              host: '127.0.0.1',
              port: first,
              app: { routes: [async (a) => void a.addHook('onClose', async () => void released.push('first app'))] },
            },
            {
              host: '127.0.0.1',
              port: taken,
              app: { routes: [async (a) => void a.addHook('onClose', async () => void released.push('second app'))] },
            },
          ];
        },
        readyWhen: 'done',
      }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'EADDRINUSE' });
      expect(released).toEqual(['second app', 'first app', 'acquired with the routes', 'loop', 'acquired with the loops', 'store']);
      // The first listener had bound its port: it is free again.
      expect(await free(first)).toBe(true);
    } finally {
      await new Promise((r) => holder.close(r));
    }
  });

  it('a step that throws before any listener releases the store it opened', async () => {
    const released: string[] = [];
    const err = await assemble({
      logger: silent,
      store: async () => {
        const store = await openWatchedFileStore({ stateDir: join(t.dir, 'early') });
        const close = store.close.bind(store);
        return Object.assign(store, { close: async () => (released.push('store'), close()) });
      },
      async loops() {
        throw new Error('no loops today');
      },
      listeners: async () => [],
      readyWhen: 'done',
    }).catch((e: unknown) => e);
    expect(err).toMatchObject({ message: 'no loops today' });
    expect(released).toEqual(['store']);
  });

  it('the gateway with its API port taken leaves no private Nginx and frees its HTTP port', async () => {
    const [apiPort, httpPort, httpsPort] = (await freePorts(3)) as [number, number, number];
    const holder = await occupy(apiPort);
    const stateDir = join(t.dir, 'gateway');
    try {
      const err = await startTestGateway({ stateDir, ports: { apiPort, httpPort, httpsPort } }).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'EADDRINUSE' });
      // The private Nginx starts with the Nginx loop, after the API listens: it never ran.
      const { paths } = mainConfText(join(stateDir, 'nginx'));
      expect(await nginxOfPrefix(paths)).toEqual([]);
      expect(await free(httpPort)).toBe(true);
    } finally {
      await new Promise((r) => holder.close(r));
    }
    // Nothing was left holding the state dir: a gateway starts on it at once.
    const again = await startTestGateway({ stateDir, ports: { apiPort, httpPort, httpsPort } });
    try {
      expect((await fetch(`${again.gw.apiUrl}/readyz`)).status).toBe(200);
    } finally {
      await again.close();
    }
  });

  it('the server proxy with its management port taken releases the proxy listener it had bound', async () => {
    const [port, apiPort] = (await freePorts(2)) as [number, number];
    const holder = await occupy(apiPort);
    try {
      const err = await startServerProxy(
        { db: `sqlite:${join(t.dir, 'sp.db')}`, stateDir: join(t.dir, 'sp'), port, apiPort },
        { logger: silent },
      ).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'EADDRINUSE' });
      expect(await free(port)).toBe(true);
    } finally {
      await new Promise((r) => holder.close(r));
    }
  });
});
