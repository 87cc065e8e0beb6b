// Secrets leave the process only as this placeholder: in GET responses, plans, diffs, logs.

import type { ProxyState, SshProxyHop } from './types.js';

export const REDACTED = '<redacted>';

/** Field names that hold secrets, wherever they appear in the document. */
export const SECRET_FIELDS: ReadonlySet<string> = new Set(['sshPrivateKey', 'privateKey', 'eabHmacKey']);

export function redact(state: ProxyState): ProxyState {
  const spec = state.spec;
  return {
    ...state,
    spec: {
      acme: spec.acme.eabHmacKey === undefined ? spec.acme : { ...spec.acme, eabHmacKey: REDACTED },
      projects: spec.projects.map((p) => (p.sshPrivateKey === undefined ? p : { ...p, sshPrivateKey: REDACTED })),
      services: spec.services.map((s) => ({
        ...s,
        replicas: s.replicas.map((r) => {
          if (!r.sshProxy?.privateKey && !r.sshHeadProxy?.privateKey) return r;
          const out = { ...r };
          if (r.sshProxy) out.sshProxy = redactHop(r.sshProxy);
          if (r.sshHeadProxy) out.sshHeadProxy = redactHop(r.sshHeadProxy);
          return out;
        }),
      })),
      entrypoints: spec.entrypoints,
    },
  };
}

function redactHop(h: SshProxyHop): SshProxyHop {
  return h.privateKey === undefined ? h : { ...h, privateKey: REDACTED };
}

/** Replace every occurrence of the document's secrets in free text (error messages, logs). */
export function scrubSecrets(text: string, state: ProxyState): string {
  let out = text;
  for (const secret of secretsOf(state)) if (secret.length >= 8) out = out.split(secret).join(REDACTED);
  return out;
}

export function secretsOf(state: ProxyState): string[] {
  const out: string[] = [];
  if (state.spec.acme.eabHmacKey) out.push(state.spec.acme.eabHmacKey);
  for (const p of state.spec.projects) if (p.sshPrivateKey) out.push(p.sshPrivateKey);
  for (const s of state.spec.services) {
    for (const r of s.replicas) {
      if (r.sshProxy?.privateKey) out.push(r.sshProxy.privateKey);
      if (r.sshHeadProxy?.privateKey) out.push(r.sshHeadProxy.privateKey);
    }
  }
  return out;
}
