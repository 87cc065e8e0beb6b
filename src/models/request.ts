// The chat-completions request: checked only as far as this module needs it. For `openai`
// models the client's bytes are forwarded as sent (the replica is the authority on which fields it
// supports); for `tgi` models the fields the conversion reads are validated here, naming the field.

import { invalidField, ModelApiError } from './errors.js';
import type { TemplateMessage } from './template.js';

export interface ChatRequest {
  /** The parsed JSON object. */
  body: Record<string, unknown>;
  model: string;
  stream: boolean;
  /** `stream_options.include_usage`. */
  includeUsage: boolean;
}

export interface TgiParams {
  messages: TemplateMessage[];
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  n: number;
  stop: string[];
  seed?: number;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export function parseJsonBody(raw: Buffer): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    throw new ModelApiError(422, `Invalid request body: not JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  if (!isObject(v)) throw invalidField('body', 'must be a JSON object');
  return v;
}

export function chatRequest(body: Record<string, unknown>): ChatRequest {
  const { model, messages, stream, stream_options: streamOptions } = body;
  if (typeof model !== 'string' || model === '') throw invalidField('model', 'is required and must be a non-empty string');
  if (!Array.isArray(messages)) throw invalidField('messages', 'is required and must be an array');
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw invalidField('stream', 'must be a boolean');
  let includeUsage = false;
  if (streamOptions !== undefined && streamOptions !== null) {
    if (!isObject(streamOptions)) throw invalidField('stream_options', 'must be an object');
    const iu = streamOptions.include_usage;
    if (iu !== undefined && iu !== null && typeof iu !== 'boolean') throw invalidField('stream_options.include_usage', 'must be a boolean');
    includeUsage = iu === true;
  }
  return { body, model, stream: stream === true, includeUsage };
}

function optionalNumber(body: Record<string, unknown>, field: string, check: (n: number) => boolean, problem: string): number | undefined {
  const v = body[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || !check(v)) throw invalidField(field, problem);
  return v;
}

/** Text of a message's content: a string, null (''), or an array of text parts joined. */
function contentText(content: unknown, i: number): string {
  if (typeof content === 'string') return content;
  if (content === null || content === undefined) return '';
  if (Array.isArray(content)) {
    return content
      .map((part, j) => {
        if (!isObject(part)) throw invalidField(`messages[${i}].content[${j}]`, 'must be an object');
        if (part.type === 'text' && typeof part.text === 'string') return part.text;
        if (part.type === 'text') throw invalidField(`messages[${i}].content[${j}].text`, 'must be a string');
        throw new ModelApiError(
          400,
          `messages[${i}].content[${j}]: content parts of type ${JSON.stringify(part.type)} are not supported by this model (tgi format takes text only)`,
        );
      })
      .join('');
  }
  throw invalidField(`messages[${i}].content`, 'must be a string, null or an array of text parts');
}

export function tgiParams(body: Record<string, unknown>): TgiParams {
  const raw = body.messages as unknown[];
  const messages = raw.map((m, i): TemplateMessage => {
    if (!isObject(m)) throw invalidField(`messages[${i}]`, 'must be an object');
    if (typeof m.role !== 'string') throw invalidField(`messages[${i}].role`, 'is required and must be a string');
    return { ...m, role: m.role, content: contentText(m.content, i) };
  });
  const maxTokens =
    optionalNumber(body, 'max_completion_tokens', (n) => Number.isInteger(n) && n >= 1, 'must be a positive integer') ??
    optionalNumber(body, 'max_tokens', (n) => Number.isInteger(n) && n >= 1, 'must be a positive integer');
  const temperature = optionalNumber(body, 'temperature', (n) => n >= 0, 'must be a number >= 0');
  const topP = optionalNumber(body, 'top_p', (n) => n > 0 && n <= 1, 'must be a number in (0, 1]');
  const seed = optionalNumber(body, 'seed', (n) => Number.isInteger(n) && n >= 0, 'must be a non-negative integer');
  const n = optionalNumber(body, 'n', (x) => Number.isInteger(x) && x >= 1, 'must be a positive integer') ?? 1;
  let stop: string[];
  const s = body.stop;
  if (s === undefined || s === null) stop = [];
  else if (typeof s === 'string') stop = [s];
  else if (Array.isArray(s) && s.every((x): x is string => typeof x === 'string')) stop = [...s];
  else throw invalidField('stop', 'must be a string or an array of strings');
  const out: TgiParams = { messages, n, stop };
  if (maxTokens !== undefined) out.maxTokens = maxTokens;
  if (temperature !== undefined) out.temperature = temperature;
  if (topP !== undefined) out.topP = topP;
  if (seed !== undefined) out.seed = seed;
  return out;
}
