// Waiting for a gateway to answer /readyz: what install and update use to decide that the
// slot they started is serving.

export type Readiness = { ready: true; afterMs: number } | { ready: false; reason: string };

/**
 * Polls `url` (the gateway's /readyz) until it answers 200 or `timeoutMs` passes. The reason
 * of a failure is the last thing seen: a status with the start of its body, or the
 * connection error.
 */
export async function waitReady(url: string, timeoutMs: number, intervalMs = 250): Promise<Readiness> {
  const start = Date.now();
  let reason = 'no answer yet';
  for (;;) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(Math.max(1000, intervalMs * 4)) });
      const body = (await res.text()).slice(0, 200).replace(/\s+/g, ' ').trim();
      if (res.status === 200) return { ready: true, afterMs: Date.now() - start };
      reason = `${url} answered ${res.status}${body ? `: ${body}` : ''}`;
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      reason = `${url}: ${cause?.code ?? cause?.message ?? (err as Error).message}`;
    }
    if (Date.now() - start + intervalMs > timeoutMs) return { ready: false, reason };
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
