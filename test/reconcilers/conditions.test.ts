import { describe, expect, it } from 'vitest';
import {
  findCondition,
  isConditionTrue,
  removeCondition,
  setCondition,
  type Condition,
  type ConditionInput,
} from '../../src/reconcilers/conditions.js';

const T0 = new Date('2025-01-01T00:00:00Z');
const T1 = new Date('2025-01-01T00:05:00Z');

const ready = (over: Partial<Condition> = {}): Condition => ({
  type: 'Ready',
  status: 'True',
  reason: 'Applied',
  message: 'ok',
  observedGeneration: 1,
  lastTransitionTime: T0,
  ...over,
});

describe('setCondition', () => {
  const cases: {
    name: string;
    list: Condition[];
    set: ConditionInput;
    changed: boolean;
    lastTransitionTime: Date;
    expect?: Partial<Condition>;
  }[] = [
    {
      name: 'a new type is added with lastTransitionTime = now',
      list: [],
      set: { type: 'Ready', status: 'True', reason: 'Applied', message: 'ok', observedGeneration: 1 },
      changed: true,
      lastTransitionTime: T1,
    },
    {
      name: 'an identical condition changes nothing',
      list: [ready()],
      set: { type: 'Ready', status: 'True', reason: 'Applied', message: 'ok', observedGeneration: 1 },
      changed: false,
      lastTransitionTime: T0,
    },
    {
      name: 'a status flip moves lastTransitionTime',
      list: [ready()],
      set: { type: 'Ready', status: 'False', reason: 'Failed', message: 'boom', observedGeneration: 1 },
      changed: true,
      lastTransitionTime: T1,
      expect: { status: 'False', reason: 'Failed', message: 'boom' },
    },
    {
      name: 'a new message without a flip keeps lastTransitionTime',
      list: [ready()],
      set: { type: 'Ready', status: 'True', reason: 'Applied', message: 'still ok', observedGeneration: 1 },
      changed: true,
      lastTransitionTime: T0,
      expect: { message: 'still ok' },
    },
    {
      name: 'a new reason without a flip keeps lastTransitionTime',
      list: [ready()],
      set: { type: 'Ready', status: 'True', reason: 'Renewed', message: 'ok', observedGeneration: 1 },
      changed: true,
      lastTransitionTime: T0,
      expect: { reason: 'Renewed' },
    },
    {
      name: 'a new observedGeneration alone is a write but not a transition',
      list: [ready()],
      set: { type: 'Ready', status: 'True', reason: 'Applied', message: 'ok', observedGeneration: 2 },
      changed: true,
      lastTransitionTime: T0,
      expect: { observedGeneration: 2 },
    },
    {
      name: 'Unknown → True is a flip',
      list: [ready({ status: 'Unknown', reason: 'Pending' })],
      set: { type: 'Ready', status: 'True', reason: 'Applied', message: 'ok', observedGeneration: 1 },
      changed: true,
      lastTransitionTime: T1,
    },
    {
      name: 'an explicit lastTransitionTime on a flip is kept',
      list: [ready()],
      set: { type: 'Ready', status: 'False', reason: 'Failed', message: 'x', lastTransitionTime: new Date(42) },
      changed: true,
      lastTransitionTime: new Date(42),
    },
  ];

  for (const c of cases) {
    it(c.name, () => {
      const before = structuredClone(c.list);
      const { conditions, changed } = setCondition(c.list, c.set, T1);
      expect(changed).toBe(c.changed);
      expect(c.list).toEqual(before); // pure: the input is untouched
      if (!changed) expect(conditions).toBe(c.list);
      const got = findCondition(conditions, c.set.type);
      expect(got?.lastTransitionTime).toEqual(c.lastTransitionTime);
      if (c.expect) expect(got).toMatchObject(c.expect);
    });
  }

  it('keeps other types and positions', () => {
    const list = [ready(), ready({ type: 'Degraded', status: 'False', reason: 'AsExpected' })];
    const { conditions } = setCondition(list, { type: 'Ready', status: 'False', reason: 'X', message: '' }, T1);
    expect(conditions.map((c) => c.type)).toEqual(['Ready', 'Degraded']);
    expect(conditions[1]).toBe(list[1]);
  });

  it('accepts now as epoch milliseconds', () => {
    const { conditions } = setCondition([], { type: 'Ready', status: 'True', reason: 'A', message: '' }, T1.getTime());
    expect(conditions[0]?.lastTransitionTime).toEqual(T1);
  });
});

describe('removeCondition / isConditionTrue', () => {
  it('removes a type and reports whether it did', () => {
    const list = [ready()];
    expect(removeCondition(list, 'Degraded')).toEqual({ conditions: list, changed: false });
    expect(removeCondition(list, 'Ready')).toEqual({ conditions: [], changed: true });
  });

  it('reads True only for status True', () => {
    expect(isConditionTrue([ready()], 'Ready')).toBe(true);
    expect(isConditionTrue([ready({ status: 'Unknown' })], 'Ready')).toBe(false);
    expect(isConditionTrue([], 'Ready')).toBe(false);
  });
});
