// Each dstack call as one pure change to the document: the current normalised document in, the
// next one (or "nothing to do", or dstack's refusal text) out. No I/O, no clock: the routes
// read the store, call this, validate and write what it returns.

import type { ProxyState } from '../../spec/index.js';
import type { Call, ListServicesResponse } from './calls.js';

export type Outcome =
  /** `state` is a candidate: the routes validate it as they would a PUT. */
  | { kind: 'changed'; state: ProxyState }
  /** The document already says what the call asks for: answer 200 and write nothing. */
  | { kind: 'same' }
  /** An expected refusal: 400 with dstack's text. */
  | { kind: 'refused'; detail: string };

export function applyCall(current: ProxyState, call: Call): Outcome {
  void current;
  void call;
  throw new Error('not implemented yet');
}

/** Every service the compatibility routes own, with its replicas: document membership, not readiness. */
export function listServices(state: ProxyState): ListServicesResponse {
  void state;
  throw new Error('not implemented yet');
}
