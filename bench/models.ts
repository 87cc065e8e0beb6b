// P-models: the OpenAI-compatible model API.
//  - TGI stream conversion throughput: one TGI `data:` line → JSON.parse → OpenAI chunk frame, on
//    one core (target ≥ 100,000 chunks/s).
//  - Added latency, non-streaming: wrk -t1 -c16 -d5s POSTs to an openai-format replica directly,
//    and to the same replica through the model API (fastify + registerModelApi + replicaForwarder
//    over TCP), in the same run; p50/p99 differences (target ≤ 2 ms added p50).
//  - Stream time to first byte through the API vs direct, p50 difference (target ≤ 5 ms).
// The replica is a separate Node process, so this process runs only the API and the TTFB client.

import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import Fastify from 'fastify';
import { Pool } from 'undici';
import { replicaForwarder } from '../src/models/forwarders.js';
import { replicasOf } from '../test/helpers/replicas.js';
import { registerModelApi } from '../src/models/plugin.js';
import { tgiStreamConverter } from '../src/models/tgi.js';
import { API_VERSION, KIND, type ProxyState } from '../src/spec/types.js';
import { freePorts } from '../test/helpers/ports.js';
import { tmpDir } from '../test/helpers/tmp.js';
import { median, percentile, type Row } from './table.js';

const run = promisify(execFile);

const REPLICA = `
const http = require('node:http');
const completion = JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'm',
  choices: [{ index: 0, message: { role: 'assistant', content: 'Hello world' }, logprobs: null, finish_reason: 'stop' }],
  usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });
http.createServer((req, res) => {
  const parts = [];
  req.on('data', (c) => parts.push(c));
  req.on('end', () => {
    if (Buffer.concat(parts).includes('"stream":true')) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\\n\\n');
      setTimeout(() => res.end('data: [DONE]\\n\\n'), 5);
      return;
    }
    res.setHeader('content-type', 'application/json');
    res.end(completion);
  });
}).listen(Number(process.argv[1]), '127.0.0.1', () => process.send && process.send('up'));
`;

const BODY = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Hi' }] });
const STREAM_BODY = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], stream: true });

/** TGI stream events converted per second on this thread. */
export function conversionRate(events = 300_000): number {
  const lines = Array.from({ length: 64 }, (_, i) =>
    JSON.stringify({
      index: i,
      token: { id: 1000 + i, text: ` word${i}`, logprob: -0.25, special: false },
      generated_text: null,
      details: null,
    }),
  );
  const run1 = (n: number): number => {
    const c = tgiStreamConverter({
      id: 'chatcmpl-0123456789abcdef',
      created: 1700000000,
      model: 'meta-llama/Llama-3.1-8B-Instruct',
      stop: ['</s>'],
      includeUsage: false,
    });
    let bytes = 0;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) for (const f of c.event(JSON.parse(lines[i & 63]!))) bytes += f.length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (bytes === 0) throw new Error('no output');
    return n / s;
  };
  run1(50_000); // warm-up
  return median([run1(events), run1(events), run1(events)]);
}

interface Wrk {
  rps: number;
  p50: number;
  p99: number;
}

async function wrkPost(url: string, script: string): Promise<Wrk> {
  const { stdout } = await run('wrk', ['-t1', '-c16', '-d5s', '--latency', '-s', script, url], { timeout: 60_000 });
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? 0);
  const ms = (p: string): number => {
    const m = new RegExp(`\\s${p}%\\s+([\\d.]+)(us|ms|s)`).exec(stdout);
    if (!m) return 0;
    const v = Number(m[1]);
    return m[2] === 'us' ? v / 1000 : m[2] === 's' ? v * 1000 : v;
  };
  if (!/ 200|Requests\/sec/.test(stdout) || /Non-2xx/.test(stdout)) throw new Error(`wrk saw errors:\n${stdout}`);
  return { rps, p50: ms('50'), p99: ms('99') };
}

/** Time to the first body byte of a streamed completion, ms, `n` sequential requests. */
async function ttfb(origin: string, path: string, headers: Record<string, string>, n: number): Promise<number[]> {
  const pool = new Pool(origin, { connections: 1 });
  const out: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const t0 = process.hrtime.bigint();
      const res = await pool.request({
        path,
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: STREAM_BODY,
      });
      if (res.statusCode !== 200) throw new Error(`TTFB request answered ${res.statusCode}`);
      for await (const _chunk of res.body) {
        out.push(Number(process.hrtime.bigint() - t0) / 1e6);
        break;
      }
      await res.body.dump().catch(() => undefined);
    }
  } finally {
    await pool.close();
  }
  return out;
}

function state(replicaPort: number): ProxyState {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.invalid/dir' },
      projects: [{ name: 'main' }],
      services: [
        {
          project: 'main',
          run: 'm',
          https: false,
          auth: true,
          clientMaxBodySize: 1 << 20,
          stripPrefix: true,
          rateLimits: [],
          model: { name: 'm', format: 'openai', prefix: '/v1' },
          replicas: [{ id: 'r1', appPort: replicaPort, direct: { host: '127.0.0.1', port: replicaPort } }],
        },
      ],
      entrypoints: [],
    },
  };
}

export async function modelRows(): Promise<Row[]> {
  const rows: Row[] = [];
  const rate = conversionRate();
  rows.push({
    id: 'M1',
    name: 'TGI stream chunks converted (parse + frame), one core',
    value: Math.round(rate),
    unit: 'chunks/s',
    target: '≥ 100,000',
    ok: rate >= 100_000,
    better: 'higher',
  });

  const t = tmpDir('dp-bench-models-');
  const [replicaPort, apiPort] = (await freePorts(2)) as [number, number];
  let replica: ChildProcess | undefined;
  const app = Fastify();
  const doc = state(replicaPort);
  const replicas = replicasOf({ 'main/m': [replicaPort] });
  const forwarder = replicaForwarder(replicas);
  try {
    replica = spawn(process.execPath, ['-e', REPLICA, String(replicaPort)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    await new Promise<void>((resolve, reject) => {
      replica!.once('message', () => resolve());
      replica!.once('exit', (code) => reject(new Error(`replica exited ${code}`)));
    });
    await registerModelApi(app, {
      prefix: '/api/models/:project',
      getState: () => doc,
      authorize: async (_p, tok) => (tok === 'bench' ? 'allow' : 'deny'),
      forward: (s, r) => forwarder.forward(s, r),
    });
    await app.listen({ host: '127.0.0.1', port: apiPort });

    const script = join(t.dir, 'post.lua');
    writeFileSync(
      script,
      `wrk.method = "POST"\nwrk.body = '${BODY}'\nwrk.headers["Content-Type"] = "application/json"\nwrk.headers["Authorization"] = "Bearer bench"\n`,
    );
    const directUrl = `http://127.0.0.1:${replicaPort}/v1/chat/completions`;
    const apiUrl = `http://127.0.0.1:${apiPort}/api/models/main/chat/completions`;
    await wrkPost(apiUrl, script); // warm-up (JIT, keep-alive pool)
    const direct: Wrk[] = [];
    const via: Wrk[] = [];
    for (let i = 0; i < 3; i++) {
      direct.push(await wrkPost(directUrl, script));
      via.push(await wrkPost(apiUrl, script));
    }
    const d50 = median(direct.map((w) => w.p50));
    const d99 = median(direct.map((w) => w.p99));
    const v50 = median(via.map((w) => w.p50));
    const v99 = median(via.map((w) => w.p99));
    const note = `direct ${d50.toFixed(2)}/${d99.toFixed(2)} ms p50/p99 at ${Math.round(median(direct.map((w) => w.rps)))} req/s; via API ${v50.toFixed(2)}/${v99.toFixed(2)} ms at ${Math.round(median(via.map((w) => w.rps)))} req/s (wrk -c16, medians of 3 alternating rounds, in-process replicaForwarder over TCP; no Nginx)`;
    rows.push({
      id: 'M2',
      name: 'model API added latency p50 (non-streaming, 16 conns)',
      value: Number((v50 - d50).toFixed(2)),
      unit: 'ms',
      target: '≤ 2 ms',
      ok: v50 - d50 <= 2,
      better: 'lower',
      note,
    });
    rows.push({
      id: 'M3',
      name: 'model API added latency p99 (non-streaming, 16 conns)',
      value: Number((v99 - d99).toFixed(2)),
      unit: 'ms',
      better: 'lower',
    });

    await ttfb(`http://127.0.0.1:${apiPort}`, '/api/models/main/chat/completions', { authorization: 'Bearer bench' }, 50);
    const tDirect = await ttfb(`http://127.0.0.1:${replicaPort}`, '/v1/chat/completions', {}, 300);
    const tVia = await ttfb(`http://127.0.0.1:${apiPort}`, '/api/models/main/chat/completions', { authorization: 'Bearer bench' }, 300);
    const added = median(tVia) - median(tDirect);
    rows.push({
      id: 'M4',
      name: 'stream first byte, added p50 (API vs direct)',
      value: Number(added.toFixed(2)),
      unit: 'ms',
      target: '≤ 5 ms',
      ok: added <= 5,
      better: 'lower',
      note: `direct p50 ${median(tDirect).toFixed(2)} ms p99 ${percentile(tDirect, 99).toFixed(2)}; via API p50 ${median(tVia).toFixed(2)} ms p99 ${percentile(tVia, 99).toFixed(2)} (300 sequential streams)`,
    });
  } finally {
    await app.close();
    await forwarder.close();
    await replicas.close();
    replica?.kill('SIGTERM');
    t.cleanup();
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  modelRows().then(
    (rows) => process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`),
    (err: unknown) => {
      process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
