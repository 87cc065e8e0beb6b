// The dry-run plan both deployments return: the document diff plus every loop's actions.

import type { Controller } from '../reconcilers/controller.js';
import { diffSpecs, type ProxyState } from '../spec/index.js';
import type { LoopPlan, Plan } from './runtime.js';

export async function planFromController(
  controller: Controller,
  next: ProxyState,
  base: ProxyState,
  notes: (loop: string, kinds: string[]) => Record<string, unknown> | undefined = () => undefined,
): Promise<Plan> {
  const actions = await controller.dryRun(next);
  const loops: Record<string, LoopPlan> = {};
  for (const [name, list] of Object.entries(actions)) {
    const extra = notes(
      name,
      list.map((a) => a.kind),
    );
    loops[name] = {
      actions: list.map((a) => ({ key: a.key, kind: a.kind, summary: a.summary, ...(a.diff ? { diff: a.diff } : {}) })),
      ...(extra ? { notes: extra } : {}),
    };
  }
  return { document: diffSpecs(base, next), loops };
}
