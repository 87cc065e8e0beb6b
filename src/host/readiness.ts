// Waiting for a gateway to answer /readyz: what install and update use to decide that the
// slot they started is serving.

export type Readiness = { ready: true; afterMs: number } | { ready: false; reason: string };

/** The `startedAt` of a /readyz answer; 0 when it has none (a gateway from before it said). */
function startedAt(text: string): number {
  try {
    const v = (JSON.parse(text) as { startedAt?: unknown }).startedAt;
    return typeof v === 'number' ? v : 0;
  } catch {
    return 0;
  }
}

/**
 * Polls `url` (the gateway's /readyz) until it answers 200 (with `startedAfter`: from a process
 * started at or after that time, ms since the epoch) or `timeoutMs` passes. The reason
 * of a failure is the last thing seen: a status with the start of its body, or the
 * connection error.
 */
export async function waitReady(url: string, timeoutMs: number, intervalMs = 250, startedAfter?: number): Promise<Readiness> {
  const start = Date.now();
  let reason = 'no answer yet';
  for (;;) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(Math.max(1000, intervalMs * 4)) });
      const text = await res.text();
      const body = text.slice(0, 200).replace(/\s+/g, ' ').trim();
      if (res.status === 200 && (startedAfter === undefined || startedAt(text) >= startedAfter)) {
        return { ready: true, afterMs: Date.now() - start };
      }
      reason =
        res.status === 200
          ? `${url} is still answered by the gateway that was running before (no new one took over)`
          : `${url} answered ${res.status}${body ? `: ${body}` : ''}`;
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      reason = `${url}: ${cause?.code ?? cause?.message ?? (err as Error).message}`;
    }
    if (Date.now() - start + intervalMs > timeoutMs) return { ready: false, reason };
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
