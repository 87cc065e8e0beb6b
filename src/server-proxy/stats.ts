// Requests counted in-process, per service, in the gateway's 1 s frames (src/stats), so
// `GET /api/stats/collect` answers in the same format and autoscaling works without a gateway.
// Every service of the document is listed (in-server, every service is reachable).

import { emptyWindows, FrameTable } from '../stats/frames.js';
import type { ServiceStats } from '../stats/collector.js';
import type { ProxyState } from '../spec/types.js';
import { serviceKey } from '../spec/types.js';

export interface InProcessStats {
  /** One request of `serviceKey` that took `ms`, finished now. */
  record(serviceKey: string, ms: number): void;
  collect(state: ProxyState): Promise<ServiceStats[]>;
  snapshot(state: ProxyState): ServiceStats[];
  /** Requests counted since start, per service key. */
  total(serviceKey: string): number;
  readonly frames: FrameTable;
}

export function createInProcessStats(o: { clock?: { now(): number }; maxServices?: number } = {}): InProcessStats {
  const clock = o.clock ?? { now: () => Date.now() };
  const frames = new FrameTable(o.maxServices);
  const snapshot = (state: ProxyState): ServiceStats[] => {
    const nowSec = Math.floor(clock.now() / 1000);
    const keep = new Set<string>();
    const out: ServiceStats[] = [];
    for (const s of state.spec.services) {
      const key = serviceKey(s);
      keep.add(key);
      const h = frames.get(key);
      out.push({ project_name: s.project, run_name: s.run, stats: h ? h.windows(nowSec) : emptyWindows() });
    }
    frames.prune(keep, nowSec);
    return out;
  };
  return {
    frames,
    record(key, ms) {
      frames.add(key, Math.floor(clock.now() / 1000), Math.max(0, Math.round(ms)));
    },
    collect: async (state) => snapshot(state),
    snapshot,
    total: (key) => frames.get(key)?.totalRequests ?? 0,
  };
}
