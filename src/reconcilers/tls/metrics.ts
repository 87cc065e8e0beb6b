// The TLS loop's metric families, read from its status outputs at scrape time.

import type { CertificateOutputs } from '../outputs.js';
import type { MetricFamily, StatusWriter } from '../types.js';

/**
 * The certificate metric families, over the loop's status outputs: an expiry per domain that
 * has a served certificate, failed attempts per domain the loop reports on.
 */
export function certificateMetricFamilies(status: () => StatusWriter | null): MetricFamily[] {
  const rows = (): [string, CertificateOutputs][] => {
    const s = status();
    if (!s) return [];
    return s.keys().flatMap((domain) => {
      const out = s.outputs(domain) as CertificateOutputs | undefined;
      return out ? [[domain, out] as [string, CertificateOutputs]] : [];
    });
  };
  return [
    {
      name: 'certificate_expiry_timestamp_seconds',
      help: 'Per domain certificate notAfter.',
      type: 'gauge',
      labelNames: ['domain'],
      read: () =>
        rows().flatMap(([domain, out]) => (out.notAfter === null ? [] : [[{ domain }, Date.parse(out.notAfter) / 1000] as const])),
    },
    {
      name: 'certificate_failed_attempts_total',
      help: 'Per domain failed certificate requests since its last success (0 again once one succeeds).',
      type: 'counter',
      labelNames: ['domain'],
      read: () => rows().map(([domain, out]) => [{ domain }, out.failedAttempts] as const),
    },
  ];
}
