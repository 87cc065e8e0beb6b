// Chat templates of `tgi` models, rendered with @huggingface/jinja (the engine transformers.js
// uses; it applies Python Jinja's trim_blocks + lstrip_blocks, as transformers does, and drops one
// trailing newline like Jinja's keep_trailing_newline=False). Globals: `messages`,
// `add_generation_prompt` (true), `bos_token`, `eos_token`, and the engine's `raise_exception`.

import { Template } from '@huggingface/jinja';
import { ModelApiError } from './errors.js';

export interface TemplateMessage {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface RenderInput {
  messages: TemplateMessage[];
  bosToken: string;
  eosToken: string;
}

/** Compiled templates by source. Documents hold few distinct templates; the cap only bounds abuse. */
const MAX_CACHED = 256;
const cache = new Map<string, Template>();

export function compileTemplate(source: string): Template {
  const hit = cache.get(source);
  if (hit) return hit;
  let t: Template;
  try {
    t = new Template(source);
  } catch (err) {
    throw new ModelApiError(400, `Failed to compile chat template: ${errorText(err)}`);
  }
  if (cache.size >= MAX_CACHED) {
    const oldest = cache.keys().next().value;
    if (oldest !== undefined) cache.delete(oldest);
  }
  cache.set(source, t);
  return t;
}

/** The prompt for `messages`; compile and render errors are 400s carrying Jinja's message. */
export function renderPrompt(source: string, input: RenderInput): string {
  const t = compileTemplate(source);
  try {
    return t.render({
      messages: input.messages,
      add_generation_prompt: true,
      bos_token: input.bosToken,
      eos_token: input.eosToken,
    });
  } catch (err) {
    throw new ModelApiError(400, `Failed to render chat template: ${errorText(err)}`);
  }
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
