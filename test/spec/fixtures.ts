// Shared material for the spec tests: a valid document, JSON-pointer edits, a seeded PRNG.

import type { ProxyStateInput } from '../../src/spec/input.js';
import { API_VERSION, KIND } from '../../src/spec/index.js';
import { TEST_KEY_A, TEST_KEY_B } from '../helpers/keys.js';

/** Real keys: validation parses every private key. */
export const MAIN_KEY = TEST_KEY_A;
export const JUMP_KEY = TEST_KEY_B;
export const EAB_HMAC = 'ZWFiLWhtYWMtc2VjcmV0LTAwMDM';

/** A small valid document touching every kind of object; tests edit copies of it. */
export function baseDocument(): ProxyStateInput {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    spec: {
      acme: { server: 'https://acme.example.com/directory', email: 'ops@example.com' },
      projects: [{ name: 'main', sshPrivateKey: MAIN_KEY }, { name: 'research' }],
      services: [
        {
          project: 'main',
          run: 'llama',
          domain: 'llama.gw.example.com',
          rateLimits: [{ prefix: '/v1/chat', key: { type: 'ipAddress' }, rps: 2.5, burst: 5 }],
          model: { name: 'meta-llama/Llama-3.1-8B-Instruct', format: 'openai', prefix: '/v1' },
          replicas: [
            { id: 'r1', appPort: 8000, ssh: { host: '203.0.113.7', user: 'ubuntu' } },
            { id: 'r2', appPort: 8000, direct: { host: '10.0.0.5', port: 8000 } },
          ],
        },
        {
          project: 'research',
          run: 'mistral',
          domain: 'mistral.gw.example.com',
          model: {
            name: 'mistralai/Mistral-7B',
            format: 'tgi',
            chatTemplate: '{% for m in messages %}{{ m.content }}{% endfor %}',
            eosToken: '</s>',
          },
          replicas: [{ id: 'r3', appPort: 80, direct: { host: '10.0.0.6', port: 80 } }],
        },
      ],
      entrypoints: [{ project: 'main', domain: 'gateway.gw.example.com' }],
    },
  };
}

export const REMOVE = Symbol('remove');
/** One edit: set the value at a JSON pointer (`-` appends to an array), or remove it. */
export type Edit = readonly [pointer: string, value: unknown];

/** A deep copy of `doc` with the edits applied in order. */
export function edited(doc: unknown, ...edits: Edit[]): unknown {
  const out: unknown = structuredClone(doc);
  for (const [pointer, value] of edits) setAt(out, pointer, value);
  return out;
}

export function setAt(root: unknown, pointer: string, value: unknown): void {
  const parts = pointer
    .split('/')
    .slice(1)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  const last = parts.pop();
  if (last === undefined) throw new Error('cannot replace the root');
  let node = root;
  for (const p of parts) node = (node as Record<string, unknown>)[p];
  if (Array.isArray(node)) {
    if (last === '-') node.push(value);
    else if (value === REMOVE) node.splice(Number(last), 1);
    else node[Number(last)] = value;
  } else {
    const obj = node as Record<string, unknown>;
    if (value === REMOVE) delete obj[last];
    else obj[last] = value;
  }
}

export function getAt(root: unknown, pointer: string): unknown {
  let node = root;
  for (const p of pointer.split('/').slice(1)) node = (node as Record<string, unknown>)[p];
  return node;
}

export { prng } from '../helpers/prng.js';

export type Rng = () => number;

export function int(rng: Rng, lo: number, hi: number): number {
  return lo + Math.floor(rng() * (hi - lo + 1));
}

export function chance(rng: Rng, p = 0.5): boolean {
  return rng() < p;
}

export function pick<T>(rng: Rng, items: readonly T[]): T {
  return items[Math.floor(rng() * items.length)]!;
}

export function shuffled<T>(rng: Rng, items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** A deep copy with object keys and list items in a random order at every level. */
export function shuffleDeep(rng: Rng, v: unknown): unknown {
  if (Array.isArray(v))
    return shuffled(
      rng,
      v.map((x) => shuffleDeep(rng, x)),
    );
  if (v === null || typeof v !== 'object') return v;
  const out: Record<string, unknown> = {};
  for (const k of shuffled(rng, Object.keys(v))) out[k] = shuffleDeep(rng, (v as Record<string, unknown>)[k]);
  return out;
}

/** Every leaf of a JSON value as [pointer, value]. */
export function leaves(v: unknown, at = ''): Array<[string, unknown]> {
  if (v === null || typeof v !== 'object') return [[at, v]];
  const entries = Array.isArray(v) ? v.map((x, i) => [String(i), x] as const) : Object.entries(v);
  return entries.flatMap(([k, x]) => leaves(x, `${at}/${k}`));
}
