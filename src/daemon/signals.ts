// How a daemon command ends: the first SIGINT or SIGTERM closes the daemon gracefully. The
// handlers are removed at once, so a second signal kills the process the default way: an
// operator can always force a shutdown that hangs.

export interface Closable {
  close(): Promise<void>;
}

/**
 * Installs the handlers at once (call it before announcing that the daemon is up) and resolves
 * once `daemon` is closed after a signal; a failing close is reported, not thrown.
 */
export function runUntilSignal(command: string, daemon: Closable, stderr: (s: string) => void): Promise<void> {
  return new Promise<void>((resolve) => {
    const stop = (signal: string): void => {
      stderr(`dstack-proxy ${command}: ${signal}, shutting down\n`);
      process.off('SIGINT', onInt);
      process.off('SIGTERM', onTerm);
      daemon.close().then(resolve, (err: unknown) => {
        stderr(`dstack-proxy ${command}: shutdown failed: ${(err as Error).message}\n`);
        resolve();
      });
    };
    const onInt = (): void => stop('SIGINT');
    const onTerm = (): void => stop('SIGTERM');
    process.on('SIGINT', onInt);
    process.on('SIGTERM', onTerm);
  });
}
