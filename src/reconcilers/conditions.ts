// Status conditions in the Kubernetes V1Condition shape, and the pure helpers that keep them
// honest: lastTransitionTime moves only when `status` flips, and an unchanged condition is not
// rewritten (apimachinery pkg/api/meta/conditions.go, SetStatusCondition).

// Type import only: a value import of @kubernetes/client-node crashes on Node 20.
import type { V1Condition } from '@kubernetes/client-node';

export type ConditionStatus = 'True' | 'False' | 'Unknown';

/** A V1Condition whose status is one of the three legal values. */
export interface Condition extends V1Condition {
  status: ConditionStatus;
}

/** What a writer supplies; lastTransitionTime is filled in by setCondition. */
export type ConditionInput = Omit<Condition, 'lastTransitionTime'> & { lastTransitionTime?: Date };

export function findCondition(list: readonly Condition[], type: string): Condition | undefined {
  return list.find((c) => c.type === type);
}

export function isConditionTrue(list: readonly Condition[], type: string): boolean {
  return findCondition(list, type)?.status === 'True';
}

/**
 * Sets `cond` in `list` without mutating it. Returns the same array and `changed: false` when
 * nothing differs. Otherwise a new array: a new type is appended; an existing one keeps its
 * position and its lastTransitionTime unless `status` changed, in which case lastTransitionTime
 * becomes cond.lastTransitionTime ?? now.
 */
export function setCondition(
  list: readonly Condition[],
  cond: ConditionInput,
  now: Date | number,
): { conditions: readonly Condition[]; changed: boolean } {
  const at = () => cond.lastTransitionTime ?? new Date(typeof now === 'number' ? now : now.getTime());
  const i = list.findIndex((c) => c.type === cond.type);
  const existing = i === -1 ? undefined : list[i];
  if (existing === undefined) {
    return { conditions: [...list, toCondition(cond, at())], changed: true };
  }
  if (existing.status !== cond.status) {
    return { conditions: replaceAt(list, i, toCondition(cond, at())), changed: true };
  }
  if (existing.reason === cond.reason && existing.message === cond.message && existing.observedGeneration === cond.observedGeneration) {
    return { conditions: list, changed: false };
  }
  return { conditions: replaceAt(list, i, toCondition(cond, existing.lastTransitionTime)), changed: true };
}

/** Removes the condition of `type`; returns the same array and `changed: false` if absent. */
export function removeCondition(list: readonly Condition[], type: string): { conditions: readonly Condition[]; changed: boolean } {
  const i = list.findIndex((c) => c.type === type);
  if (i === -1) return { conditions: list, changed: false };
  return { conditions: [...list.slice(0, i), ...list.slice(i + 1)], changed: true };
}

function toCondition(cond: ConditionInput, lastTransitionTime: Date): Condition {
  const c: Condition = {
    type: cond.type,
    status: cond.status,
    reason: cond.reason,
    message: cond.message,
    lastTransitionTime,
  };
  if (cond.observedGeneration !== undefined) c.observedGeneration = cond.observedGeneration;
  return c;
}

function replaceAt(list: readonly Condition[], i: number, c: Condition): Condition[] {
  const out = [...list];
  out[i] = c;
  return out;
}
