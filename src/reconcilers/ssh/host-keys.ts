// Host key checks: a pinned SHA256 fingerprint per hop when the document gives one, else trust
// on first use for the lifetime of the process. A hop is named by the whole path that reaches
// it (`a:22>b:22`), because 127.0.0.1:22 seen from a jump host is another machine.

import { createHash } from 'node:crypto';

/** `SHA256:<base64 without padding>`, as `ssh-keygen -lf` prints it. */
export function sha256Fingerprint(keyBlob: Buffer): string {
  return `SHA256:${createHash('sha256').update(keyBlob).digest('base64').replace(/=+$/, '')}`;
}

export type HostKeyVerdict = { ok: true } | { ok: false; message: string };

export class HostKeyBook {
  readonly #seen = new Map<string, string>();

  /** Checks (and on first use records) the key `endpoint` presented. */
  check(endpoint: string, keyBlob: Buffer, pinned?: string): HostKeyVerdict {
    const got = sha256Fingerprint(keyBlob);
    if (pinned !== undefined) {
      if (pinned.replace(/=+$/, '') === got) return { ok: true };
      return { ok: false, message: `host key of ${endpoint} is ${got}, the document pins ${pinned}` };
    }
    const known = this.#seen.get(endpoint);
    if (known === undefined) {
      this.#seen.set(endpoint, got);
      return { ok: true };
    }
    if (known === got) return { ok: true };
    return { ok: false, message: `host key of ${endpoint} changed from ${known} to ${got}; refusing to connect` };
  }

  /** The fingerprint trusted for `endpoint`, if any. */
  get(endpoint: string): string | undefined {
    return this.#seen.get(endpoint);
  }
}
