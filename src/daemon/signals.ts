// How a daemon command ends: the first SIGINT or SIGTERM closes the daemon gracefully. A second
// SIGINT (Ctrl-C again) ends the process at once (exit 130), so an operator can always force a
// shutdown that hangs. A second SIGTERM does not: a gateway taking over sends one to a gateway
// that may already be stopping (a restart told it first), and that one must still finish what it
// has in flight. A service manager's stop timeout ends with SIGKILL anyway.
//
// The handlers stay installed until the process ends. A library that restores a signal's default
// action when it finds no other listener (execa's child cleanup, through signal-exit) would
// otherwise re-raise the first signal the moment ours removed itself, and the graceful close
// would be cut short whenever a child process (an `nginx -t`, a reload) happened to be running.

import { constants } from 'node:os';

export interface Closable {
  close(): Promise<void>;
}

/**
 * Installs the handlers at once (call it before announcing that the daemon is up) and resolves
 * once `daemon` is closed after a signal; a failing close is reported, not thrown.
 */
export function runUntilSignal(command: string, daemon: Closable, stderr: (s: string) => void): Promise<void> {
  return new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (signal: 'SIGINT' | 'SIGTERM'): void => {
      if (stopping) {
        if (signal === 'SIGTERM')
          return void stderr(`dstack-proxy ${command}: SIGTERM again, already shutting down (SIGINT ends it at once)\n`);
        stderr(`dstack-proxy ${command}: ${signal} again, exiting now\n`);
        process.exit(128 + constants.signals[signal]);
      }
      stopping = true;
      stderr(`dstack-proxy ${command}: ${signal}, shutting down\n`);
      daemon.close().then(resolve, (err: unknown) => {
        stderr(`dstack-proxy ${command}: shutdown failed: ${(err as Error).message}\n`);
        resolve();
      });
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });
}
