import { parseArgs } from 'node:util';
import { SpecError, detectFormat, formatIssue, loadDocument } from '../spec/index.js';
import type { Command } from './command.js';
import { readDocumentArg } from './read-input.js';

export const validateCommand: Command = {
  name: 'validate',
  summary: 'check a desired-state document',
  help: `Usage: dstack-proxy validate -f FILE

Check a desired-state document (YAML or JSON, by extension or content) without applying it.

Options:
  -f, --file FILE   the document; - reads standard input
  -h, --help        show this help

Exit codes: 0 valid, 1 invalid (one "path: message" line per error on stderr), 2 usage error.`,
  async run(argv, io) {
    const { values } = parseArgs({ args: argv, options: { file: { type: 'string', short: 'f' } }, strict: true });
    const { text, name } = await readDocumentArg(values.file, io);
    try {
      const state = loadDocument(text, detectFormat(text, name));
      const replicas = state.spec.services.reduce((n, s) => n + s.replicas.length, 0);
      io.stdout(`valid (${plural(state.spec.services.length, 'service')}, ${plural(replicas, 'replica')})\n`);
      return 0;
    } catch (err) {
      if (!(err instanceof SpecError)) throw err;
      for (const issue of err.issues) io.stderr(`${formatIssue(issue)}\n`);
      return 1;
    }
  },
};

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}
