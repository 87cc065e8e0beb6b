// The state-store contract: the current normalised document with its generation and hash.
// The gateway keeps it in state.json (file-store.ts); the in-server proxy in SQLite or
// PostgreSQL behind the same interface.

import { ProxyError } from '../errors.js';
import type { ProxyState } from '../spec/index.js';

export interface StoredState {
  /** 0 before the first accepted document. */
  generation: number;
  hash: string;
  state: ProxyState;
  /** ISO time of the write that produced this generation; '' at generation 0. */
  updatedAt: string;
}

export interface WriteOptions {
  /** Write only if the current generation equals this; else DP_ERR_GENERATION_MISMATCH. */
  ifMatch?: number;
}

/** The document stored after the write (the current one when nothing changed): nobody re-reads to learn it. */
export interface WriteResult extends StoredState {
  changed: boolean;
}

export interface StateStore {
  read(): Promise<StoredState>;
  /** An equal hash is a no-op: nothing written, generation kept, `changed: false`. */
  write(state: ProxyState, options?: WriteOptions): Promise<WriteResult>;
  close(): Promise<void>;
}

/** The error of a conditional write whose If-Match is not the current generation. */
export function mismatch(ifMatch: number, generation: number): ProxyError {
  return new ProxyError('DP_ERR_GENERATION_MISMATCH', `If-Match is ${ifMatch}; the current generation is ${generation}`, { generation });
}
