// Loaded with `node --expose-gc --import <this file> dist/src/cli.js gateway …` into a daemon the
// scale bench measures: on SIGUSR2 it runs a full collection and prints one line on stderr with
// the memory figures after it, so the bench reads the RSS of live data, not of garbage that a
// later collection would free. The daemon's own code is not changed.

const gc = (globalThis as { gc?: () => void }).gc;

process.on('SIGUSR2', () => {
  // Twice: the first collection can leave objects whose finalizers free more in the second.
  gc?.();
  gc?.();
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
});
