// Requests counted in-process, per service, in the gateway's 1 s frames (src/stats), so
// `GET /api/stats/collect` answers in the same format and autoscaling works without a gateway.
// Every service of the document is listed (in-server, every service is reachable).

import { FrameTable, type ServiceStats } from '../stats/frames.js';
import type { ProxyState } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';

export interface InProcessStats {
  /** One request of `serviceKey` that took `ms`, finished now. */
  record(serviceKey: string, ms: number): void;
  collect(state: ProxyState): Promise<ServiceStats[]>;
  readonly frames: FrameTable;
}

export function createInProcessStats(o: { clock?: { now(): number }; maxServices?: number } = {}): InProcessStats {
  const clock = o.clock ?? { now: () => Date.now() };
  const frames = new FrameTable(o.maxServices);
  return {
    frames,
    record(key, ms) {
      frames.add(key, Math.floor(clock.now() / 1000), Math.max(0, Math.round(ms)));
    },
    collect: async (state) => frames.serviceStats(state.spec.services, serviceKey, Math.floor(clock.now() / 1000)),
  };
}
