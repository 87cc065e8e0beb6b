// Stand-in model servers for the model API tests: small HTTP servers speaking the OpenAI and
// TGI protocols, recording what they received. Streams can be held open on a Gate.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { close } from '../helpers/http.js';

export interface Received {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: string;
}

export type Handler = (req: IncomingMessage, body: string, res: ServerResponse) => void | Promise<void>;

export interface Replica {
  port: number;
  received: Received[];
  /** Handlers used (and removed) by the next requests, before the default one. */
  next: Handler[];
  close(): Promise<void>;
}

/** A promise released by hand: a replica waits on it between two chunks. */
export class Gate {
  released = false;
  readonly #wait: Promise<void>;
  #open!: () => void;
  constructor() {
    this.#wait = new Promise((r) => (this.#open = r));
  }
  release(): void {
    this.released = true;
    this.#open();
  }
  wait(): Promise<void> {
    return this.#wait;
  }
}

async function startReplica(fallback: Handler): Promise<Replica> {
  const received: Received[] = [];
  const next: Handler[] = [];
  const srv: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts).toString('utf8');
      received.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      void Promise.resolve((next.shift() ?? fallback)(req, body, res)).catch(() => res.destroy());
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const addr = srv.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return { port, received, next, close: () => close(srv) };
}

export const sse = (res: ServerResponse, data: unknown): boolean =>
  res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);

export function openaiChunk(content: string | null, finish: string | null = null): Record<string, unknown> {
  return {
    id: 'chatcmpl-up',
    object: 'chat.completion.chunk',
    created: 1,
    model: 'oa-model',
    choices: [{ index: 0, delta: content === null ? {} : { role: 'assistant', content }, logprobs: null, finish_reason: finish }],
  };
}

/** OpenAI protocol: `Hello world`, streamed as two chunks with `gate` (if any) between them. */
export function startOpenAIReplica(gate?: () => Gate | undefined): Promise<Replica> {
  return startReplica(async (_req, body, res) => {
    const json = JSON.parse(body) as { stream?: boolean; model: string };
    if (!json.stream) {
      res.setHeader('content-type', 'application/json');
      res.end(
        JSON.stringify({
          id: 'chatcmpl-up',
          object: 'chat.completion',
          created: 1,
          model: json.model,
          choices: [{ index: 0, message: { role: 'assistant', content: 'Hello world' }, logprobs: null, finish_reason: 'stop' }],
          usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
        }),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    sse(res, openaiChunk('Hello'));
    await gate?.()?.wait();
    sse(res, openaiChunk(' world'));
    sse(res, openaiChunk(null, 'stop'));
    sse(res, '[DONE]');
    res.end();
  });
}

export const tgiToken = (text: string, special = false) => ({
  index: 0,
  token: { id: 1, text, logprob: -0.1, special },
  generated_text: null,
  details: null,
});

/** TGI protocol: `Hello there` then eos, streamed token by token with `gate` (if any) after the first. */
export function startTgiReplica(gate?: () => Gate | undefined): Promise<Replica> {
  return startReplica(async (req, _body, res) => {
    if (req.url === '/generate') {
      res.setHeader('content-type', 'application/json');
      res.end(
        JSON.stringify({
          generated_text: 'Hello there<|im_end|>',
          details: {
            finish_reason: 'eos_token',
            generated_tokens: 3,
            seed: 11,
            prefill: [{ id: 1 }, { id: 2 }, { id: 3 }, { id: 4 }],
            tokens: [],
          },
        }),
      );
      return;
    }
    if (req.url !== '/generate_stream') {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    sse(res, tgiToken('Hello'));
    await gate?.()?.wait();
    sse(res, tgiToken(' there'));
    sse(res, {
      index: 2,
      token: { id: 2, text: '<|im_end|>', logprob: 0, special: true },
      generated_text: 'Hello there',
      details: { finish_reason: 'eos_token', generated_tokens: 3, seed: 11, input_length: 4 },
    });
    res.end();
  });
}
