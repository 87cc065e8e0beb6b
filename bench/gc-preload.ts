// Loaded with `node --expose-gc --import <this file> dist/src/cli.js gateway …` into a daemon the
// scale bench measures: on SIGUSR2 it runs a full collection and prints one line on stderr with
// the memory figures after it, so the bench reads the RSS of live data, not of garbage that a
// later collection would free. The daemon's own code is not changed.

const gc = (globalThis as { gc?: () => void }).gc;

/**
 * How long the figures wait after the collection: V8 sweeps and gives pages back to the system
 * on its own threads after gc() returns, so an RSS read at once may still count freed memory.
 */
const RELEASE_MS = 1_000;

process.on('SIGUSR2', () => {
  // Twice: the first collection can leave objects whose finalizers free more in the second.
  gc?.();
  gc?.();
  setTimeout(report, RELEASE_MS);
});

function report(): void {
  const m = process.memoryUsage();
  const figures = {
    gc: gc !== undefined,
    rss: m.rss,
    heapUsed: m.heapUsed,
    heapTotal: m.heapTotal,
    external: m.external,
    arrayBuffers: m.arrayBuffers,
  };
  process.stderr.write(`bench-memory ${JSON.stringify(figures)}\n`);
}
