// Conversion between OpenAI chat completions and TGI's /generate and /generate_stream
// (reference Part 2.8), kept as pure functions so they are table-tested and benchmarked alone.
// Beyond dstack: temperature 0 means greedy (do_sample false; TGI rejects 0), the final stream
// event's token text is kept when it is real text (finish `length`), `stream_options.include_usage`
// yields a usage chunk, n > 1 with streaming is refused (TGI cannot stream best_of).

import { ModelApiError } from './errors.js';
import type { TgiParams } from './request.js';

export interface TgiPayload {
  inputs: string;
  parameters: Record<string, unknown>;
}

/** The stop list TGI gets: the client's, then the eos token unless already there. */
export function stopList(stop: string[], eosToken: string | undefined): string[] {
  const out = [...stop];
  if (eosToken && !out.includes(eosToken)) out.push(eosToken);
  return out;
}

export function tgiPayload(prompt: string, p: TgiParams, stop: string[], stream: boolean): TgiPayload {
  if (stream && p.n > 1)
    throw new ModelApiError(400, 'n > 1 is not supported with stream: true for this model (TGI cannot stream best_of)');
  const parameters: Record<string, unknown> = { do_sample: p.temperature !== 0 };
  if (p.maxTokens !== undefined) parameters.max_new_tokens = p.maxTokens;
  parameters.stop = stop;
  if (p.seed !== undefined) parameters.seed = p.seed;
  if (p.temperature !== undefined && p.temperature !== 0) parameters.temperature = p.temperature;
  parameters.best_of = p.n;
  parameters.details = true;
  parameters.decoder_input_details = !stream;
  if (p.topP !== undefined && p.topP < 1) parameters.top_p = p.topP;
  return { inputs: prompt, parameters };
}

export type FinishReason = 'stop' | 'length';

export function mapFinishReason(reason: unknown): FinishReason {
  switch (reason) {
    case 'length':
      return 'length';
    case 'eos_token':
    case 'stop_sequence':
      return 'stop';
    default:
      throw new ModelApiError(502, `Unknown finish reason: ${String(reason)}`);
  }
}

/** Removes, once, the first stop token (in list order) the text ends with — as dstack does. */
export function trimStop(text: string, stop: string[]): string {
  for (const s of stop) if (text.endsWith(s)) return text.slice(0, text.length - s.length);
  return text;
}

export interface CompletionContext {
  id: string;
  /** Unix seconds. */
  created: number;
  model: string;
  stop: string[];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const invalid = (what: string): ModelApiError => new ModelApiError(502, `Invalid response from model: ${what}`);
const count = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) ? v : 0);

function sequence(generatedText: unknown, details: unknown, where: string): { text: string; finish: FinishReason; tokens: number } {
  if (typeof generatedText !== 'string') throw invalid(`${where}generated_text is not a string`);
  if (!isObject(details)) throw invalid(`${where}details is missing`);
  return { text: generatedText, finish: mapFinishReason(details.finish_reason), tokens: count(details.generated_tokens) };
}

/** A TGI /generate answer as an OpenAI chat.completion (one choice per best_of sequence). */
export function tgiCompletion(data: unknown, ctx: CompletionContext): Record<string, unknown> {
  if (!isObject(data)) throw invalid('not a JSON object');
  const first = sequence(data.generated_text, data.details, '');
  const details = data.details as Record<string, unknown>;
  const seqs = [first];
  const best = details.best_of_sequences;
  if (Array.isArray(best))
    best.forEach((b, i) => seqs.push(sequence(isObject(b) ? b.generated_text : undefined, b, `best_of_sequences[${i}].`)));
  const completion = seqs.reduce((a, s) => a + s.tokens, 0);
  const prompt = Array.isArray(details.prefill) ? details.prefill.length : 0;
  return {
    id: ctx.id,
    object: 'chat.completion',
    created: ctx.created,
    model: ctx.model,
    system_fingerprint: fingerprint(details.seed),
    choices: seqs.map((s, index) => ({
      index,
      message: { role: 'assistant', content: trimStop(s.text, ctx.stop) },
      logprobs: null,
      finish_reason: s.finish,
    })),
    usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
  };
}

function fingerprint(seed: unknown): string {
  return typeof seed === 'number' ? `fp_${seed}` : '';
}

export interface StreamConverter {
  /** The SSE frames for one TGI event (parsed JSON of a `data:` line). Throws ModelApiError on an `error` event. */
  event(data: unknown): string[];
  /** Whether the final event (with `details`) was seen. */
  readonly done: boolean;
}

/**
 * One converter per stream. Frames are `data: {json}\n\n`; the envelope is serialised once and
 * each token only adds its JSON-escaped text, so conversion costs one JSON.stringify of a string.
 */
export function tgiStreamConverter(ctx: CompletionContext & { includeUsage: boolean }): StreamConverter {
  const head = `data: {"id":${JSON.stringify(ctx.id)},"object":"chat.completion.chunk","created":${ctx.created},"model":${JSON.stringify(ctx.model)},"system_fingerprint":"","choices":[`;
  const contentHead = `${head}{"index":0,"delta":{"role":"assistant","content":`;
  const contentTail = '},"logprobs":null,"finish_reason":null}]}\n\n';
  let sent = '';
  let done = false;

  const content = (text: string): string => contentHead + JSON.stringify(text) + contentTail;

  return {
    get done() {
      return done;
    },
    event(data: unknown): string[] {
      if (!isObject(data)) throw new ModelApiError(502, 'Invalid chunk in model stream: not a JSON object');
      if (data.error !== undefined && data.error !== null) throw streamError(data);
      const token = isObject(data.token) ? data.token : undefined;
      const text = token && typeof token.text === 'string' ? token.text : '';
      const special = token?.special === true;
      const details = data.details;
      if (details === undefined || details === null) {
        if (special || text === '') return [];
        sent += text;
        return [content(text)];
      }
      // The final event: its token is real text unless it is a special or stop token.
      if (!isObject(details)) throw new ModelApiError(502, 'Invalid chunk in model stream: details is not an object');
      const finish = mapFinishReason(details.finish_reason);
      done = true;
      const frames: string[] = [];
      let rest = '';
      if (typeof data.generated_text === 'string') {
        const full = trimStop(data.generated_text, ctx.stop);
        if (full.startsWith(sent)) rest = full.slice(sent.length);
      } else if (!special && details.finish_reason === 'length') {
        rest = text;
      }
      if (rest !== '') frames.push(content(rest));
      frames.push(`${head}{"index":0,"delta":{},"logprobs":null,"finish_reason":"${finish}"}]}\n\n`);
      if (ctx.includeUsage) {
        const prompt = count(details.input_length);
        const completion = count(details.generated_tokens);
        const usage = { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
        frames.push(`${head}],"usage":${JSON.stringify(usage)}}\n\n`);
      }
      return frames;
    },
  };
}

/** TGI's `{"error": "...", "error_type": "..."}` as an error with a fitting status. */
function streamError(data: Record<string, unknown>): ModelApiError {
  const message = typeof data.error === 'string' ? data.error : JSON.stringify(data.error);
  const status = data.error_type === 'validation' ? 422 : data.error_type === 'overloaded' ? 503 : 502;
  return new ModelApiError(status, message);
}
