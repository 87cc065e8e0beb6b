// Server-sent events: reading `data:` lines from a replica's stream, and writing our frames.

import { StringDecoder } from 'node:string_decoder';
import type { ModelApiError } from './errors.js';

/**
 * The payloads of `data:` lines, in order, from a byte stream. Other lines (comments, `event:`,
 * blank separators) are skipped; multi-line events are not joined (TGI and OpenAI send one line).
 */
export async function* dataLines(body: AsyncIterable<Buffer | string>): AsyncGenerator<string> {
  const decoder = new StringDecoder('utf8');
  let buf = '';
  for await (const chunk of body) {
    buf += typeof chunk === 'string' ? chunk : decoder.write(chunk);
    let nl: number;
    let start = 0;
    while ((nl = buf.indexOf('\n', start)) !== -1) {
      const line = buf.slice(start, nl);
      start = nl + 1;
      const payload = dataPayload(line);
      if (payload !== null) yield payload;
    }
    buf = buf.slice(start);
  }
  buf += decoder.end();
  const payload = dataPayload(buf);
  if (payload !== null) yield payload;
}

function dataPayload(line: string): string | null {
  if (!line.startsWith('data:')) return null;
  return line.slice(5).trim();
}

export const DONE_FRAME = 'data: [DONE]\n\n';

/**
 * The frame that ends a stream which failed after it started: an `error` event whose data carries
 * an OpenAI-style `error` object (the OpenAI SDKs throw an APIError on it) and dstack's `detail`.
 */
export function errorFrame(err: ModelApiError): string {
  return `event: error\ndata: ${JSON.stringify(err.body())}\n\n`;
}
