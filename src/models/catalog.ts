// The models of a document, indexed once per document object: by project, then by name.

import type { ProxyState, Service } from '../spec/types.js';
import { modelKey, type FirstSeenStore } from './first-seen.js';

export interface ModelEntry {
  name: string;
  service: Service & { model: NonNullable<Service['model']> };
}

export type Catalog = Map<string, Map<string, ModelEntry>>;

const catalogs = new WeakMap<ProxyState, Catalog>();

/** project → model name → entry, names sorted. Two services offering one name: the first run wins. */
export function catalogOf(state: ProxyState): Catalog {
  let c = catalogs.get(state);
  if (c) return c;
  const byProject = new Map<string, ModelEntry[]>();
  for (const s of state.spec.services) {
    if (!s.model) continue;
    const list = byProject.get(s.project) ?? [];
    list.push({ name: s.model.name, service: s as ModelEntry['service'] });
    byProject.set(s.project, list);
  }
  c = new Map();
  for (const [project, list] of byProject) {
    list.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const m = new Map<string, ModelEntry>();
    for (const e of list) if (!m.has(e.name)) m.set(e.name, e);
    c.set(project, m);
  }
  catalogs.set(state, c);
  return c;
}

export function modelKeys(state: ProxyState): string[] {
  const keys: string[] = [];
  for (const [project, models] of catalogOf(state)) for (const name of models.keys()) keys.push(modelKey(project, name));
  return keys;
}

const synced = new WeakMap<FirstSeenStore, WeakMap<ProxyState, Promise<Map<string, number>>>>();

/**
 * The first-seen time of every model of `state`, syncing the store once per document object.
 * Call it when a document is accepted so `created` is the time it appeared; the model API also
 * calls it lazily.
 */
export function observeModels(store: FirstSeenStore, state: ProxyState, nowSec: number): Promise<Map<string, number>> {
  let perState = synced.get(store);
  if (!perState) {
    perState = new WeakMap();
    synced.set(store, perState);
  }
  let p = perState.get(state);
  if (!p) {
    const mine = store.sync(modelKeys(state), nowSec);
    perState.set(state, mine);
    mine.catch(() => perState.delete(state));
    p = mine;
  }
  return p;
}
