// What the database stores add to the StateStore contract: change notification and health.
// Rows may be written by a control server in another language, so every row read is validated
// and normalised exactly like a PUT; an invalid row is never returned — the last good
// document stays current and health() says why (RowTracker below does that bookkeeping).

import type { Logger } from 'pino';
import { SpecError, formatIssue, hashSpec, parseJsonText, specJson, validate, type SpecIssue } from '../spec/index.js';
import type { StateStore, StoredState } from './store.js';

export type StoreKind = 'file' | 'sqlite' | 'postgres';

export interface StoreError {
  /** 'invalid': the stored document failed validation; 'unreachable': the database did not answer. */
  reason: 'invalid' | 'unreachable';
  message: string;
  /** ISO time the error was seen. */
  at: string;
  /** The generation of the rejected row ('invalid' only). */
  generation?: number;
  issues?: SpecIssue[];
}

export interface StoreHealth {
  kind: StoreKind;
  /** The generation read() returns; undefined until a valid document has been read. */
  generation: number | undefined;
  /** The newest generation seen in storage: ahead of `generation` while that row is invalid. */
  storedGeneration: number | undefined;
  /** False while the database is unreachable (PostgreSQL) — read() serves the last good document. */
  connected: boolean;
  /** Why storage and `generation` differ, or why the database is unreachable; cleared when fixed. */
  lastError: StoreError | undefined;
}

/** Called with the new current document whenever the current generation changes. */
export type ChangeListener = (state: StoredState) => void;

export interface WatchedStateStore extends StateStore {
  readonly kind: StoreKind;
  /**
   * Start watching (polls / LISTEN start with the first listener); returns an unsubscribe.
   * Writes through this instance are reported too. Listener errors are logged, not thrown.
   */
  watch(listener: ChangeListener): () => void;
  health(): StoreHealth;
}

export interface RawRow {
  generation: number;
  /** The document: a parsed JSON value (PostgreSQL jsonb) or JSON text (SQLite, state.json). */
  document: unknown;
  /** ISO time, '' when unknown. */
  updatedAt: string;
}

/** The last good document, the last error and the listeners of one store instance. */
export class RowTracker {
  private good: StoredState | undefined;
  private storedGeneration: number | undefined;
  /** The generation of a row already found invalid: not validated again on every poll. */
  private badGeneration: number | undefined;
  private lastError: StoreError | undefined;
  private connected = true;
  private readonly listeners = new Set<ChangeListener>();

  constructor(
    readonly kind: StoreKind,
    private readonly logger: Logger | undefined,
    private readonly clock: { now(): number },
  ) {}

  get current(): StoredState | undefined {
    return this.good;
  }

  /** Take a row read from storage; returns the current good document afterwards. */
  accept(row: RawRow): StoredState | undefined {
    this.markConnected();
    // A read that raced a newer write (ours or a NOTIFY's refresh) must not roll back:
    // generations only grow (a trigger refuses anything else).
    if (this.good && row.generation < this.good.generation) return this.good;
    this.storedGeneration = row.generation;
    if (row.generation === this.good?.generation) return this.good;
    if (row.generation === this.badGeneration) return this.good;
    const parsed = checkRow(row);
    if (!parsed.ok) {
      this.badGeneration = row.generation;
      this.lastError = {
        reason: 'invalid',
        message: `stored generation ${row.generation} is invalid and was not applied: ${parsed.message}`,
        at: this.now(),
        generation: row.generation,
        issues: parsed.issues,
      };
      this.logger?.warn({ store: this.kind, generation: row.generation, issues: parsed.issues }, this.lastError.message);
      return this.good;
    }
    this.badGeneration = undefined;
    if (this.lastError?.reason === 'invalid') this.lastError = undefined;
    this.setGood(parsed.state);
    return this.good;
  }

  /** A write through this store committed: no need to validate what we wrote. */
  wrote(state: StoredState): void {
    this.markConnected();
    this.storedGeneration = state.generation;
    this.badGeneration = undefined;
    if (this.lastError?.reason === 'invalid') this.lastError = undefined;
    this.setGood(state);
  }

  /** Storage holds something that is not a valid document (state.json: loadStateFile's error). */
  reject(message: string, generation?: number): void {
    this.markConnected();
    if (generation !== undefined) this.storedGeneration = generation;
    this.lastError = { reason: 'invalid', message, at: this.now(), ...(generation !== undefined ? { generation } : {}) };
    this.logger?.warn({ store: this.kind, generation }, message);
  }

  markUnreachable(err: unknown): void {
    const message = err instanceof Error ? err.message : String(err);
    if (this.connected) this.logger?.warn({ store: this.kind, err: message }, 'state database unreachable; serving the last good document');
    this.connected = false;
    this.lastError = { reason: 'unreachable', message, at: this.now() };
  }

  markConnected(): void {
    if (this.connected) return;
    this.connected = true;
    if (this.lastError?.reason === 'unreachable') this.lastError = undefined;
    this.logger?.info({ store: this.kind }, 'state database reachable again');
  }

  health(): StoreHealth {
    return {
      kind: this.kind,
      generation: this.good?.generation,
      storedGeneration: this.storedGeneration,
      connected: this.connected,
      lastError: this.lastError,
    };
  }

  /** How a row's content hash compares, for the write no-op check (undefined: invalid row). */
  hashOf(row: RawRow): string | undefined {
    if (row.generation === this.good?.generation) return this.good.hash;
    const parsed = checkRow(row);
    return parsed.ok ? parsed.state.hash : undefined;
  }

  subscribe(listener: ChangeListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  get watched(): boolean {
    return this.listeners.size > 0;
  }

  private setGood(state: StoredState): void {
    const changed = state.generation !== this.good?.generation || state.hash !== this.good.hash;
    this.good = state;
    if (!changed) return;
    for (const listener of [...this.listeners]) {
      try {
        listener(state);
      } catch (err) {
        this.logger?.error({ store: this.kind, err }, 'state change listener failed');
      }
    }
  }

  private now(): string {
    return new Date(this.clock.now()).toISOString();
  }
}

type Checked = { ok: true; state: StoredState } | { ok: false; message: string; issues: SpecIssue[] };

function checkRow(row: RawRow): Checked {
  let doc = row.document;
  if (typeof doc === 'string') {
    try {
      doc = parseJsonText(doc, 'not JSON');
    } catch (err) {
      if (!(err instanceof SpecError)) throw err;
      return { ok: false, message: err.issues.map(formatIssue).join('; '), issues: err.issues };
    }
  }
  if (typeof doc === 'object' && doc !== null && !Array.isArray(doc) && 'metadata' in doc) {
    const { metadata: _ignored, ...rest } = doc as Record<string, unknown>;
    doc = rest;
  }
  const result = validate(doc);
  if (!result.ok) return { ok: false, message: result.errors.slice(0, 5).map(formatIssue).join('; '), issues: result.errors };
  const state = result.state;
  return { ok: true, state: { generation: row.generation, hash: hashSpec(state), state, updatedAt: row.updatedAt } };
}

/**
 * The stored form of a document, as JSON: apiVersion, kind and spec (metadata lives in columns).
 * The services' texts are those memoised for the document hash: a write in which one service
 * changed serialises that one.
 */
export function documentJson(state: StoredState['state']): string {
  return `{"apiVersion":${JSON.stringify(state.apiVersion)},"kind":${JSON.stringify(state.kind)},"spec":${specJson(state.spec)}}`;
}
