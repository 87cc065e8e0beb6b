import { readFile } from 'node:fs/promises';
import type { Io } from './command.js';
import { UsageError } from './command.js';

/** Read `-f FILE` (or `-` for stdin); returns the text and a name for format detection. */
export async function readDocumentArg(file: string | undefined, io: Io): Promise<{ text: string; name?: string }> {
  if (!file) throw new UsageError('-f FILE is required (use - for standard input)');
  if (file === '-') return { text: await io.readStdin() };
  try {
    return { text: await readFile(file, 'utf8'), name: file };
  } catch (err) {
    throw new UsageError(`cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}
