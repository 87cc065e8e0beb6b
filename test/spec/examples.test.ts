// The example documents a user starts from are valid.

import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { loadDocument, validate, parseDocument } from '../../src/spec/index.js';

const example = (name: string): Promise<string> => readFile(new URL(`../../examples/${name}`, import.meta.url), 'utf8');

describe('examples', () => {
  it.each(['gateway-state.yaml', 'local-state.yaml'])('%s validates', async (name) => {
    const text = await example(name);
    const result = validate(parseDocument(text, 'yaml'));
    expect(result.ok ? [] : result.errors).toEqual([]);
    expect(loadDocument(text).spec.services.length).toBeGreaterThan(0);
  });

  it('gateway-state.yaml shows jump hosts, rate limits and both model formats', async () => {
    const state = loadDocument(await example('gateway-state.yaml'));
    const replicas = state.spec.services.flatMap((s) => s.replicas);
    expect(replicas.some((r) => r.sshProxy && r.sshHeadProxy)).toBe(true);
    expect(replicas.some((r) => r.direct)).toBe(true);
    expect(
      state.spec.services
        .map((s) => s.model?.format)
        .filter(Boolean)
        .sort(),
    ).toEqual(['openai', 'tgi']);
    expect(state.spec.entrypoints).toHaveLength(1);
  });
});
