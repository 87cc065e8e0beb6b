// The TGI conversion as pure functions: parameter mapping, finish reasons, stop trimming, usage,
// stream chunks.

import { describe, expect, it } from 'vitest';
import { ModelApiError } from '../../src/models/errors.js';
import { tgiParams } from '../../src/models/request.js';
import { mapFinishReason, stopList, tgiCompletion, tgiPayload, tgiStreamConverter, trimStop } from '../../src/models/tgi.js';

const msgs = [{ role: 'user', content: 'Hi' }];

describe('parameter mapping', () => {
  it.each([
    ['defaults', {}, false, { do_sample: true, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: true }],
    [
      'every mapped field',
      { max_tokens: 7, temperature: 0.5, top_p: 0.9, seed: 42, stop: '###', n: 2 },
      false,
      {
        do_sample: true,
        max_new_tokens: 7,
        stop: ['###', '</s>'],
        seed: 42,
        temperature: 0.5,
        best_of: 2,
        details: true,
        decoder_input_details: true,
        top_p: 0.9,
      },
    ],
    [
      'max_completion_tokens wins over max_tokens',
      { max_tokens: 7, max_completion_tokens: 9 },
      true,
      { do_sample: true, max_new_tokens: 9, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: false },
    ],
    [
      'top_p 1 and null are omitted',
      { top_p: 1 },
      false,
      { do_sample: true, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: true },
    ],
    [
      'top_p null is omitted (dstack answers 500)',
      { top_p: null },
      false,
      { do_sample: true, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: true },
    ],
    [
      'temperature 0 is greedy',
      { temperature: 0 },
      false,
      { do_sample: false, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: true },
    ],
    [
      'the eos token is not repeated',
      { stop: ['</s>', 'x'] },
      false,
      { do_sample: true, stop: ['</s>', 'x'], best_of: 1, details: true, decoder_input_details: true },
    ],
    [
      'ignored fields stay out',
      { frequency_penalty: 1, presence_penalty: 1, logit_bias: {}, user: 'u', tools: [] },
      false,
      { do_sample: true, stop: ['</s>'], best_of: 1, details: true, decoder_input_details: true },
    ],
  ])('%s', (_name, extra, stream, parameters) => {
    const p = tgiParams({ model: 'm', messages: msgs, ...extra });
    const payload = tgiPayload('PROMPT', p, stopList(p.stop, '</s>'), stream);
    expect(payload).toEqual({ inputs: 'PROMPT', parameters });
  });

  it.each([
    ['max_tokens', { max_tokens: -1 }],
    ['temperature', { temperature: 'hot' }],
    ['top_p', { top_p: 2 }],
    ['stop', { stop: [1] }],
    ['n', { n: 1.5 }],
    ['messages[0].role', { messages: [{ content: 'x' }] }],
  ])('an invalid %s is a 422 naming the field', (field, extra) => {
    const run = () => tgiParams({ model: 'm', messages: msgs, ...extra });
    expect(run).toThrow(ModelApiError);
    expect(run).toThrow(field);
  });

  it('joins text parts and refuses image parts with a 400', () => {
    expect(
      tgiParams({
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'a' },
              { type: 'text', text: 'b' },
            ],
          },
        ],
      }).messages[0]!.content,
    ).toBe('ab');
    expect(tgiParams({ messages: [{ role: 'assistant', content: null }] }).messages[0]!.content).toBe('');
    try {
      tgiParams({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] });
      expect.unreachable();
    } catch (err) {
      expect((err as ModelApiError).status).toBe(400);
      expect((err as ModelApiError).message).toMatch(/image_url.*not supported/);
    }
  });

  it('refuses n > 1 when streaming', () => {
    const p = tgiParams({ messages: msgs, n: 2 });
    expect(() => tgiPayload('x', p, [], true)).toThrow(/n > 1/);
  });
});

describe('finish reasons and stop trimming', () => {
  it.each([
    ['length', 'length'],
    ['eos_token', 'stop'],
    ['stop_sequence', 'stop'],
  ])('%s → %s', (tgi, openai) => expect(mapFinishReason(tgi)).toBe(openai));

  it('an unknown finish reason is a 502', () => {
    expect(() => mapFinishReason('weird')).toThrow('Unknown finish reason: weird');
  });

  it.each([
    ['ab###</s>', ['###', '</s>'], 'ab###'],
    ['abc</s></s>', ['</s>'], 'abc</s>'],
    ['abc', ['</s>'], 'abc'],
    ['abc', ['', '</s>'], 'abc'],
    ['ab###', ['</s>', '###'], 'ab'],
  ])('trimStop(%j, %j) = %j', (text, stop, out) => expect(trimStop(text, stop)).toBe(out));
});

describe('non-streaming conversion', () => {
  const ctx = { id: 'chatcmpl-1', created: 1700000000, model: 'tgi-model', stop: ['###', '</s>'] };

  it('builds choices, usage and the fingerprint', () => {
    const data = {
      generated_text: 'Hello###',
      details: {
        finish_reason: 'stop_sequence',
        generated_tokens: 3,
        seed: 7,
        prefill: [{}, {}, {}, {}],
        best_of_sequences: [
          { generated_text: 'Yo</s>', finish_reason: 'eos_token', generated_tokens: 2 },
          { generated_text: 'Long', finish_reason: 'length', generated_tokens: 5 },
        ],
      },
    };
    expect(tgiCompletion(data, ctx)).toEqual({
      id: 'chatcmpl-1',
      object: 'chat.completion',
      created: 1700000000,
      model: 'tgi-model',
      system_fingerprint: 'fp_7',
      choices: [
        { index: 0, message: { role: 'assistant', content: 'Hello' }, logprobs: null, finish_reason: 'stop' },
        { index: 1, message: { role: 'assistant', content: 'Yo' }, logprobs: null, finish_reason: 'stop' },
        { index: 2, message: { role: 'assistant', content: 'Long' }, logprobs: null, finish_reason: 'length' },
      ],
      usage: { prompt_tokens: 4, completion_tokens: 10, total_tokens: 14 },
    });
  });

  it('a malformed answer is a 502', () => {
    expect(() => tgiCompletion({ generated_text: 1 }, ctx)).toThrow(/Invalid response from model/);
  });
});

describe('stream conversion', () => {
  const ctx = { id: 'c1', created: 1, model: 'm', stop: ['</s>'] };
  const frames = (xs: string[]) => xs.map((f) => JSON.parse(f.slice('data: '.length)) as Record<string, unknown>);
  const tok = (text: string, special = false) => ({ token: { id: 1, text, logprob: 0, special }, generated_text: null, details: null });

  it('one chunk per token, the final token kept when the finish reason is length, then a usage chunk', () => {
    const c = tgiStreamConverter({ ...ctx, includeUsage: true });
    const out = [
      ...c.event(tok('Hel')),
      ...c.event(tok('lo')),
      ...c.event({
        token: { text: ' you', special: false },
        generated_text: 'Hello you',
        details: { finish_reason: 'length', generated_tokens: 3, seed: null, input_length: 5 },
      }),
    ];
    expect(c.done).toBe(true);
    expect(out.every((f) => f.startsWith('data: ') && f.endsWith('\n\n'))).toBe(true);
    const parsed = frames(out);
    expect(parsed.map((p) => (p.choices as { delta: { content?: string } }[])[0]?.delta.content)).toEqual([
      'Hel',
      'lo',
      ' you',
      undefined,
      undefined,
    ]);
    expect(parsed[0]).toEqual({
      id: 'c1',
      object: 'chat.completion.chunk',
      created: 1,
      model: 'm',
      system_fingerprint: '',
      choices: [{ index: 0, delta: { role: 'assistant', content: 'Hel' }, logprobs: null, finish_reason: null }],
    });
    expect((parsed[3]!.choices as { finish_reason: string }[])[0]!.finish_reason).toBe('length');
    expect(parsed[4]).toMatchObject({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } });
  });

  it('the eos token is not sent as text', () => {
    const c = tgiStreamConverter({ ...ctx, includeUsage: false });
    const out = [
      ...c.event(tok('Hi')),
      ...c.event({
        token: { text: '</s>', special: true },
        generated_text: 'Hi',
        details: { finish_reason: 'eos_token', generated_tokens: 2 },
      }),
    ];
    const parsed = frames(out);
    expect(parsed).toHaveLength(2);
    expect((parsed[1]!.choices as { finish_reason: string }[])[0]!.finish_reason).toBe('stop');
  });

  it('an error event throws with TGI message', () => {
    const c = tgiStreamConverter({ ...ctx, includeUsage: false });
    expect(() => c.event({ error: 'Request failed during generation: oom', error_type: 'generation' })).toThrow(
      'Request failed during generation: oom',
    );
  });
});
