// The stats side of the gateway: access-log tail → per-host 1 s frames → 30/60/300 s windows.

export { createStatsCollector, DEFAULT_STATS_POLL_MS } from './collector.js';
export type { ServiceStats, ServiceTotals, StatsCollector, StatsCollectorOptions, StatsCounters } from './collector.js';
export { emptyWindows, FrameTable, HostFrames, WINDOWS } from './frames.js';
export type { WindowStat, WindowStats } from './frames.js';
export { daysFromCivil, newParseCounters, parseIsoSeconds, parseLines } from './parse.js';
export type { ParseCounters } from './parse.js';
export { LogTail } from './tail.js';
export type { LogTailOptions, TailCounters } from './tail.js';
