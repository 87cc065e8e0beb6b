// Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for tests of web
// pages: open a page, evaluate an expression in it, take a screenshot. The protocol goes over
// undici's WebSocket; nothing else is needed.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocket } from 'undici';

export interface TestPage {
  /** The value of a JavaScript expression in the page (awaited when it is a promise). */
  evaluate<T>(expression: string): Promise<T>;
  /** A PNG of the whole page, written to `path`. */
  screenshot(path: string): Promise<void>;
}

export interface TestBrowser {
  open(url: string): Promise<TestPage>;
  close(): Promise<void>;
}

export async function startChromium(o: { width?: number; height?: number } = {}): Promise<TestBrowser> {
  const dir = mkdtempSync(join(tmpdir(), 'dp-chromium-'));
  // Root in a test machine: Chromium's sandbox needs a user namespace it may not get.
  const proc: ChildProcess = spawn(
    'chromium',
    [
      '--headless=new',
      '--no-sandbox',
      '--disable-gpu',
      '--no-first-run',
      '--remote-debugging-port=0',
      `--user-data-dir=${dir}`,
      'about:blank',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  const endpoint = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`chromium did not start within 30 s: ${log}`)), 30_000);
    proc.stderr!.on('data', (d: Buffer) => {
      log = (log + d.toString()).slice(-4000);
      const m = /DevTools listening on (ws:\/\/\S+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    proc.once('error', reject);
    proc.once('exit', (code) => reject(new Error(`chromium exited ${code}: ${log}`)));
  });
  const ws = new WebSocket(endpoint);
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener('open', () => resolve());
    ws.addEventListener('error', () => reject(new Error(`cannot reach ${endpoint}`)));
  });
  let next = 0;
  const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  const events: { method: string; sessionId?: string }[] = [];
  ws.addEventListener('message', (e) => {
    const m = JSON.parse(String(e.data)) as {
      id?: number;
      result?: unknown;
      error?: { message: string };
      method?: string;
      sessionId?: string;
    };
    if (m.id === undefined) return void events.push({ method: m.method!, ...(m.sessionId ? { sessionId: m.sessionId } : {}) });
    const w = waiting.get(m.id);
    waiting.delete(m.id);
    if (m.error) w?.reject(new Error(m.error.message));
    else w?.resolve(m.result);
  });
  const send = <T>(method: string, params: Record<string, unknown> = {}, sessionId?: string): Promise<T> =>
    new Promise<T>((resolve, reject) => {
      const id = ++next;
      waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
    });
  const width = o.width ?? 1280;
  const height = o.height ?? 900;
  return {
    async open(url) {
      const { targetId } = await send<{ targetId: string }>('Target.createTarget', { url: 'about:blank' });
      const { sessionId } = await send<{ sessionId: string }>('Target.attachToTarget', { targetId, flatten: true });
      await send('Page.enable', {}, sessionId);
      await send('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: 1, mobile: false }, sessionId);
      const loaded = events.length;
      await send('Page.navigate', { url }, sessionId);
      for (let i = 0; !events.slice(loaded).some((e) => e.method === 'Page.loadEventFired' && e.sessionId === sessionId); i++) {
        if (i > 300) throw new Error(`${url} did not load within 30 s`);
        await new Promise((r) => setTimeout(r, 100));
      }
      return {
        async evaluate<T>(expression: string): Promise<T> {
          const r = await send<{ result: { value: T }; exceptionDetails?: { text: string } }>(
            'Runtime.evaluate',
            { expression, returnByValue: true, awaitPromise: true },
            sessionId,
          );
          if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.text}`);
          return r.result.value;
        },
        async screenshot(path: string) {
          const { data } = await send<{ data: string }>(
            'Page.captureScreenshot',
            { format: 'png', captureBeyondViewport: true },
            sessionId,
          );
          writeFileSync(path, Buffer.from(data, 'base64'));
        },
      };
    },
    async close() {
      ws.close();
      if (proc.exitCode === null) {
        proc.kill('SIGTERM');
        await new Promise((r) => proc.once('exit', r));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
