// What changed between two normalised documents, per object. Secrets show only as
// '<redacted>' with `secret: true` — the diff says that a key changed, never what it is.

import { compareServices } from './normalise.js';
import { REDACTED, SECRET_FIELDS } from './redact.js';
import type { ProxyState, Replica, Service } from './types.js';
import { serviceKey } from './types.js';

export type ObjectKind = 'acme' | 'project' | 'service' | 'replica' | 'entrypoint';

export interface FieldChange {
  /** Dotted path inside the object, e.g. `ssh.host`. */
  field: string;
  old?: unknown;
  new?: unknown;
  secret?: true;
}

export interface ObjectChange {
  kind: ObjectKind;
  /** project name, `project/run`, `project/run/replicaId`, or the entrypoint's domain. */
  key: string;
  op: 'added' | 'removed' | 'changed';
  fields?: FieldChange[];
}

export interface SpecDiff {
  changes: ObjectChange[];
  added: number;
  removed: number;
  changed: number;
}

export function diffSpecs(oldState: ProxyState, newState: ProxyState): SpecDiff {
  const changes: ObjectChange[] = [];
  const a = oldState.spec;
  const b = newState.spec;

  const acmeFields = fieldChanges(a.acme, b.acme);
  if (acmeFields.length > 0) changes.push({ kind: 'acme', key: 'acme', op: 'changed', fields: acmeFields });

  diffKeyed(changes, 'project', a.projects, b.projects, (p) => p.name);
  diffKeyed(changes, 'entrypoint', a.entrypoints, b.entrypoints, (e) => e.domain);

  // Both service lists are sorted by (project, run) — normalise() guarantees it — so one
  // merge walk pairs them without building maps of 10,000 entries.
  const as = a.services;
  const bs = b.services;
  let i = 0;
  let j = 0;
  while (i < as.length || j < bs.length) {
    const s = as[i];
    const next = bs[j];
    const order = !s ? 1 : !next ? -1 : compareServices(s, next);
    if (order < 0) {
      const key = serviceKey(s!);
      changes.push({ kind: 'service', key, op: 'removed' });
      for (const r of s!.replicas) changes.push({ kind: 'replica', key: `${key}/${r.id}`, op: 'removed' });
      i++;
    } else if (order > 0) {
      const key = serviceKey(next!);
      changes.push({ kind: 'service', key, op: 'added' });
      for (const r of next!.replicas) changes.push({ kind: 'replica', key: `${key}/${r.id}`, op: 'added' });
      j++;
    } else {
      i++;
      j++;
      if (deepEqual(s, next)) continue; // the common case in a large document
      const key = serviceKey(s!);
      const fields = fieldChanges(withoutReplicas(s!), withoutReplicas(next!));
      if (fields.length > 0) changes.push({ kind: 'service', key, op: 'changed', fields });
      diffReplicas(changes, key, s!.replicas, next!.replicas);
    }
  }

  let added = 0;
  let removed = 0;
  let changed = 0;
  for (const c of changes) {
    if (c.op === 'added') added++;
    else if (c.op === 'removed') removed++;
    else changed++;
  }
  return { changes, added, removed, changed };
}

function diffReplicas(out: ObjectChange[], service: string, a: Replica[], b: Replica[]): void {
  if (a.length === b.length && a.every((r, i) => deepEqual(r, b[i]))) return;
  diffKeyed(out, 'replica', a, b, (r) => `${service}/${r.id}`);
}

function diffKeyed<T extends object>(out: ObjectChange[], kind: ObjectKind, a: T[], b: T[], key: (t: T) => string): void {
  const oldByKey = indexBy(a, key);
  const newByKey = indexBy(b, key);
  for (const [k, v] of oldByKey) {
    const next = newByKey.get(k);
    if (!next) out.push({ kind, key: k, op: 'removed' });
    else {
      const fields = fieldChanges(v, next);
      if (fields.length > 0) out.push({ kind, key: k, op: 'changed', fields });
    }
  }
  for (const k of newByKey.keys()) if (!oldByKey.has(k)) out.push({ kind, key: k, op: 'added' });
}

function withoutReplicas(s: Service): Omit<Service, 'replicas'> {
  const { replicas: _replicas, ...rest } = s;
  return rest;
}

/** Leaf-level changes between two plain objects; arrays compare as a whole. */
export function fieldChanges(a: object, b: object, prefix = ''): FieldChange[] {
  const out: FieldChange[] = [];
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  const keys = new Set([...Object.keys(ra), ...Object.keys(rb)]);
  for (const k of [...keys].sort()) {
    const va = ra[k];
    const vb = rb[k];
    if (deepEqual(va, vb)) continue;
    const field = prefix ? `${prefix}.${k}` : k;
    if (SECRET_FIELDS.has(k)) {
      const change: FieldChange = { field, secret: true };
      if (va !== undefined) change.old = REDACTED;
      if (vb !== undefined) change.new = REDACTED;
      out.push(change);
    } else if (isPlainObject(va) && isPlainObject(vb)) {
      out.push(...fieldChanges(va, vb, field));
    } else if (isPlainObject(va) || isPlainObject(vb)) {
      // An object appeared or vanished (e.g. sshProxy): name it, keep its secrets out.
      const change: FieldChange = { field };
      if (va !== undefined) change.old = scrub(va);
      if (vb !== undefined) change.new = scrub(vb);
      out.push(change);
    } else {
      const change: FieldChange = { field };
      if (va !== undefined) change.old = va;
      if (vb !== undefined) change.new = vb;
      out.push(change);
    }
  }
  return out;
}

function scrub(v: unknown): unknown {
  if (!isPlainObject(v)) return v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[k] = SECRET_FIELDS.has(k) ? REDACTED : scrub(x);
  return out;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function indexBy<T>(items: T[], key: (t: T) => string): Map<string, T> {
  const m = new Map<string, T>();
  for (const it of items) m.set(key(it), it);
  return m;
}

export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!deepEqual(a[i], b[i])) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  // for…in rather than Object.keys: no array per object on the 10,000-service path.
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  let count = 0;
  for (const k in ra) {
    if (!deepEqual(ra[k], rb[k])) return false;
    count++;
  }
  for (const _ in rb) count--;
  return count === 0;
}
