// A real Prometheus for the monitoring tests: Debian's `prometheus` package extracted with
// `dpkg -x` into node_modules/.cache (not installed: no service, no user; its two programs are
// static), and a server started on a free loopback port with a given configuration.

import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from './ports.js';

const CACHE = resolve('node_modules', '.cache', 'dstack-proxy-prometheus');

/** prometheus and promtool from Debian's package, fetched once. */
export function prometheusPrograms(): { prometheus: string; promtool: string } {
  const bin = join(CACHE, 'usr', 'bin');
  if (!existsSync(join(bin, 'promtool'))) {
    const tmp = mkdtempSync(join(tmpdir(), 'dp-prom-deb-'));
    try {
      try {
        execFileSync('apt-get', ['download', 'prometheus'], { cwd: tmp, stdio: 'pipe' });
      } catch {
        // A machine whose package lists were never fetched knows no `prometheus` package yet.
        execFileSync('apt-get', ['update', '-qq'], { stdio: 'pipe' });
        execFileSync('apt-get', ['download', 'prometheus'], { cwd: tmp, stdio: 'pipe' });
      }
      const deb = readdirSync(tmp).find((f) => f.startsWith('prometheus_') && f.endsWith('.deb'));
      if (!deb) throw new Error('apt-get download prometheus fetched no .deb');
      execFileSync('dpkg', ['-x', join(tmp, deb), join(tmp, 'x')]);
      mkdirSync(join(CACHE, '..'), { recursive: true });
      rmSync(CACHE, { recursive: true, force: true });
      renameSync(join(tmp, 'x'), CACHE);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }
  return { prometheus: join(bin, 'prometheus'), promtool: join(bin, 'promtool') };
}

export interface PromSeries {
  metric: Record<string, string>;
  value: [number, string];
}

export interface PromAlert {
  labels: Record<string, string>;
  state: 'pending' | 'firing';
}

export interface TestPrometheus {
  url: string;
  /** An instant query: its vector (an error answer throws). */
  query(expr: string): Promise<PromSeries[]>;
  /** The alerts pending or firing now. */
  alerts(): Promise<PromAlert[]>;
  stop(): Promise<void>;
}

/** Starts Prometheus with `config` (prometheus.yml text) and the files it names, in a dir of its own. */
export async function startPrometheus(config: (dir: string) => string, files: Record<string, string> = {}): Promise<TestPrometheus> {
  const { prometheus } = prometheusPrograms();
  const dir = mkdtempSync(join(tmpdir(), 'dp-prom-'));
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  writeFileSync(join(dir, 'prometheus.yml'), config(dir));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const proc = spawn(
    prometheus,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  proc.stderr.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-4000)));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const api = async <T>(path: string): Promise<T> => {
    const r = await fetch(`${url}${path}`);
    const body = (await r.json()) as { status: string; data: T; error?: string };
    if (body.status !== 'success') throw new Error(`Prometheus ${path}: ${body.error ?? r.status}`);
    return body.data;
  };
  for (let i = 0; ; i++) {
    if (proc.exitCode !== null) throw new Error(`prometheus exited ${proc.exitCode}: ${log}`);
    const ready = await fetch(`${url}/-/ready`).catch(() => null);
    if (ready?.status === 200) break;
    if (i > 300) throw new Error(`prometheus not ready within 30 s: ${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    query: async (expr) => (await api<{ result: PromSeries[] }>(`/api/v1/query?query=${encodeURIComponent(expr)}`)).result,
    alerts: async () => (await api<{ alerts: PromAlert[] }>('/api/v1/alerts')).alerts,
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
