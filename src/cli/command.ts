// What every CLI command is: a name, its help text, and a run function returning the exit code.

export interface Io {
  stdout: (s: string) => void;
  stderr: (s: string) => void;
  readStdin: () => Promise<string>;
  isTTY: boolean;
  env: NodeJS.ProcessEnv;
}

export interface Command {
  name: string;
  summary: string;
  help: string;
  run(argv: string[], io: Io): Promise<number>;
  /** The command reads --help itself (a command with verbs, whose verbs have their own help). */
  ownHelp?: boolean;
}

/** Exit code for usage errors (bad flags, missing arguments). */
export const EXIT_USAGE = 2;

export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}
