// ESLint flat config: the recommended JavaScript and typescript-eslint rules, plus four rules
// that need type information and catch what `tsc --noEmit` lets through: a promise where a
// callback's return is ignored, `await` of what is no promise, throwing a non-Error, and an
// object turned into '[object Object]'. The whole type-aware set takes about four times as long
// on a small machine; these four cost the type information once. Each rule changed from
// recommended says why.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'coverage/', 'node_modules/', '.dstack-proxy/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { ...globals.node } },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // A leading underscore marks a value that is deliberately dropped, most often a field
      // left out of a rest copy (`const { certPem: _c, ...check } = ...`).
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
      // Header, name and terminal-output checks match control characters on purpose.
      'no-control-regex': 'off',
      // A `let` that a closure reads before its single later assignment cannot be a `const`.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
    },
  },
  {
    files: ['src/**/*.ts', 'test/**/*.ts', 'bench/**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/only-throw-error': 'error',
      '@typescript-eslint/no-base-to-string': 'error',
    },
  },
  {
    // Tests build deliberately malformed documents by reaching into plain objects.
    files: ['test/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
);
