// Counts the writes storage refused (DP_ERR_STATE_WRITE: disk full, read-only, no permission),
// for /metrics: each one is a change the API answered 503 and nothing applied.

import { ProxyError } from '../errors.js';
import type { StateStore } from './store.js';

export function countWriteFailures<S extends StateStore>(store: S): S & { writeFailures(): number } {
  let failures = 0;
  const write = store.write.bind(store);
  return Object.assign(store, {
    write: async (...args: Parameters<StateStore['write']>) => {
      try {
        return await write(...args);
      } catch (err) {
        if (err instanceof ProxyError && err.code === 'DP_ERR_STATE_WRITE') failures++;
        throw err;
      }
    },
    writeFailures: () => failures,
  });
}
