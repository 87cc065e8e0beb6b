import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // The SSH loop checks each plan that skipped converged services against a full one.
    env: { DSTACK_PROXY_CHECK_PLANS: '1' },
  },
});
