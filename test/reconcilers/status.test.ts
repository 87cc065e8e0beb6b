import { describe, expect, it } from 'vitest';
import { sortedObjects, StatusStore } from '../../src/reconcilers/status.js';

function store(): { s: StatusStore; changes: () => number } {
  let changes = 0;
  const s = new StatusStore({ now: () => 1000, generation: () => 7, onChange: () => changes++ });
  return { s, changes: () => changes };
}

describe('StatusStore snapshots', () => {
  it('hand out one live view of the objects: later writes show, an entry read stays as it was', () => {
    const { s, changes } = store();
    const w = s.writer();
    w.set('b', { type: 'Ready', status: 'False', reason: 'Pending', message: '' });
    const snap = s.snapshot({});
    const before = snap.objects.b!;
    w.set('b', { type: 'Ready', status: 'True', reason: 'Up', message: '' });
    w.setOutputs('a', { socket: '/run/a.sock' });
    // The same object both times: no copy per write.
    expect(s.snapshot({}).objects).toBe(snap.objects);
    expect(snap.objects.b!.conditions[0]!.status).toBe('True');
    expect(snap.objects.a!.outputs).toEqual({ socket: '/run/a.sock' });
    // Entries are replaced, never changed: what was read keeps its value.
    expect(before.conditions[0]!.status).toBe('False');
    expect(Object.isFrozen(before)).toBe(true);
    expect(Object.isFrozen(before.conditions[0])).toBe(true);
    w.delete('b');
    expect('b' in snap.objects).toBe(false);
    expect(changes()).toBe(4);
  });

  it('an unchanged write is no change; outputs cleared on an object without conditions remove it', () => {
    const { s, changes } = store();
    const w = s.writer();
    w.setOutputs('x', { n: 1 });
    w.setOutputs('x', { n: 1 });
    expect(changes()).toBe(1);
    w.setOutputs('x', undefined);
    expect(s.snapshot({}).objects).toEqual({});
    expect(changes()).toBe(2);
  });

  it('sortedObjects gives a sorted copy that later writes leave alone', () => {
    const { s } = store();
    const w = s.writer();
    for (const k of ['c', 'a', 'b']) w.setOutputs(k, { k });
    const copy = sortedObjects(s.snapshot({}).objects);
    expect(Object.keys(copy)).toEqual(['a', 'b', 'c']);
    w.delete('a');
    expect(Object.keys(copy)).toEqual(['a', 'b', 'c']);
  });
});
