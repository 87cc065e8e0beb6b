// Chat templates rendered by @huggingface/jinja must match what Python's jinja2 renders.
// The expected strings in chat-templates.json were produced once with Python jinja2 3.1.6 by
// `python3 test/models/gen-chat-templates.py` (ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, a raise_exception global, as dstack and transformers configure it), from the
// templates and messages in chat-templates.cases.json. The templates are the published ones of
// ChatML models, meta-llama/Llama-2-7b-chat-hf, Meta-Llama-3-8B-Instruct,
// mistralai/Mistral-7B-Instruct-v0.1 and HuggingFaceH4/zephyr-7b-beta.

import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ModelApiError } from '../../src/models/errors.js';
import { renderPrompt } from '../../src/models/template.js';

interface Case {
  name: string;
  template: string;
  bos: string;
  eos: string;
  messages: { role: string; content: string }[];
  expected?: string;
  error?: string;
}
const fixture = JSON.parse(readFileSync(new URL('./chat-templates.json', import.meta.url), 'utf8')) as {
  templates: Record<string, string>;
  cases: Case[];
};

describe('chat templates render as Python jinja2 does', () => {
  it.each(fixture.cases.map((c) => [c.name, c] as const))('%s', (_name, c) => {
    const source = fixture.templates[c.template]!;
    const run = () => renderPrompt(source, { messages: c.messages, bosToken: c.bos, eosToken: c.eos });
    if (c.error !== undefined) {
      expect(run).toThrow(ModelApiError);
      expect(run).toThrow(`Failed to render chat template: ${c.error}`);
      try {
        run();
      } catch (err) {
        expect((err as ModelApiError).status).toBe(400);
      }
    } else {
      expect(run()).toBe(c.expected);
    }
  });

  it('a template that does not compile is a 400 naming the problem', () => {
    expect(() => renderPrompt('{% if %}', { messages: [], bosToken: '', eosToken: '' })).toThrow(/^Failed to compile chat template: /);
  });
});
