// Checks a set of loops at the door and orders them so every loop comes after the loops it
// dependsOn (start-up and notify() run them in that order).

import { ProxyError } from '../errors.js';
import type { Action, AnyLoop } from './types.js';

/**
 * Throws DP_ERR_BAD_OPTION on duplicate names, a loop with neither apply nor applyBatch, an
 * unknown dependency or watched loop, or a dependency cycle. Returns the loops in dependency order.
 */
export function orderLoops(loops: readonly AnyLoop[]): AnyLoop[] {
  const byName = new Map<string, AnyLoop>();
  for (const loop of loops) {
    if (byName.has(loop.name)) badOption(`two loops are named ${loop.name}`);
    if (loop.apply === undefined && loop.applyBatch === undefined) badOption(`loop ${loop.name} has neither apply nor applyBatch`);
    byName.set(loop.name, loop);
  }
  const out: AnyLoop[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = (loop: AnyLoop, path: string[]): void => {
    const s = state.get(loop.name);
    if (s === 'done') return;
    if (s === 'visiting') badOption(`loops depend on each other: ${[...path, loop.name].join(' → ')}`);
    state.set(loop.name, 'visiting');
    for (const name of loop.dependsOn ?? []) {
      const dep = byName.get(name);
      if (dep === undefined) badOption(`loop ${loop.name} depends on unknown loop ${name}`);
      else visit(dep, [...path, loop.name]);
    }
    state.set(loop.name, 'done');
    out.push(loop);
  };
  for (const loop of loops) visit(loop, []);
  for (const loop of loops) {
    for (const name of loop.triggeredBy ?? [])
      if (!(loop.dependsOn ?? []).includes(name)) badOption(`loop ${loop.name} is triggered by ${name}, which it does not depend on`);
  }
  // Watching needs no order (nothing waits on it), so it may point back at a dependent.
  for (const loop of loops) {
    for (const name of loop.watches ?? []) if (!byName.has(name)) badOption(`loop ${loop.name} watches unknown loop ${name}`);
  }
  return out;
}

/** A plan must name each key once: two actions on one key would race. */
export function assertUniqueKeys(loop: string, actions: readonly Action<unknown>[]): void {
  const seen = new Set<string>();
  for (const a of actions) {
    if (seen.has(a.key)) throw new Error(`loop ${loop} planned two actions with key ${a.key}`);
    seen.add(a.key);
  }
}

export function badOption(message: string): never {
  throw new ProxyError('DP_ERR_BAD_OPTION', message);
}
