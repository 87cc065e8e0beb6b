// Streams on the data path meet errors long after the code that made them stopped looking: a
// client hangs up while its body is still being read by nobody, a replica's body is destroyed
// between the promise that hands it over and the first reader. An 'error' with no listener is
// thrown by Node's EventEmitter and ends the process, so every stream made or taken here gets a
// listener that lasts as long as the stream; readers that care still see the error (through
// their own listener, a pipeline or an async iterator).

import type { Stream } from 'node:stream';

const ignore = (): void => undefined;

/** `stream`, with an 'error' listener for its whole life (added once). */
export function withErrorPath<T extends Stream>(stream: T): T {
  if (!stream.listeners('error').includes(ignore)) stream.on('error', ignore);
  return stream;
}
