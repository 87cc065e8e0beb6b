// An AuthProvider that counts its decisions, for /metrics: `unavailable` rising means the
// control server does not answer, and every `auth: true` request is refused meanwhile.

import type { AuthDecision, AuthProvider } from './control-server.js';

export interface CountedAuth extends AuthProvider {
  /** Decisions since the start, cached answers included. */
  counts(): Readonly<Record<AuthDecision, number>>;
}

export function countDecisions(provider: AuthProvider): CountedAuth {
  const counts: Record<AuthDecision, number> = { allow: 0, deny: 0, unauthenticated: 0, unavailable: 0 };
  return {
    async check(project, token) {
      const decision = await provider.check(project, token);
      counts[decision]++;
      return decision;
    },
    close: () => provider.close(),
    counts: () => counts,
  };
}
