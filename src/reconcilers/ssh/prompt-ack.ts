// Prompt TCP ACKs for sshd. sshd turns TCP_NODELAY on only for sessions with a tty, so on our
// tunnels its socket runs Nagle: a small packet it writes while an earlier one is still
// unacknowledged waits for our ACK. Linux delays an ACK for up to 40 ms when the receiver has
// nothing to send, so whenever sshd's packets arrive in a lull of ours (a window adjust, a reply
// that prompts no request yet, several channels answering at once) the next reply stalls 40 ms.
// Measured with 16 client connections over one SSH connection: p99 20–45 ms, ~40 delayed-ACK
// timer expiries a second. The cure is to send something soon after every arrival that we did not
// answer: an SSH_MSG_IGNORE (RFC 4253 §11.2), which the peer discards and which carries our ACK.
// Under load our own requests carry the ACK and no IGNORE is sent; when a channel goes quiet,
// at most one IGNORE follows the last packet received.

import type { Duplex } from 'node:stream';
import { systemClock, type Clock, type TimerHandle } from '../../clock.js';

/** sshd's delayed-ACK stall is 40 ms; answering within 1 ms keeps it below the noise. */
export const PROMPT_ACK_MS = 1;

/**
 * Watches an SSH client's transport: when bytes arrived and the client wrote nothing for
 * `delayMs`, calls `nudge()` (which should write an SSH_MSG_IGNORE). Wraps transport.write, so it
 * must be installed before or after any other wrapper that calls through to the previous write.
 */
export function ackPromptly(transport: Duplex, nudge: () => void, o: { clock?: Clock; delayMs?: number } = {}): void {
  const clock = o.clock ?? systemClock;
  const delayMs = o.delayMs ?? PROMPT_ACK_MS;
  /** Bytes arrived that nothing we wrote has answered yet. */
  let owed = false;
  let since = 0;
  let timer: TimerHandle | null = null;
  const write = transport.write.bind(transport) as (chunk: Buffer) => boolean;
  transport.write = ((chunk: Buffer): boolean => {
    owed = false;
    return write(chunk);
  }) as Duplex['write'];
  const check = (): void => {
    timer = null;
    if (!owed || transport.destroyed || transport.writableEnded) return;
    // The debt may be younger than the timer (answered, then owed again): wait out the rest.
    const left = since + delayMs - clock.now();
    if (left > 0) {
      arm(left);
      return;
    }
    owed = false;
    nudge();
  };
  const arm = (ms: number): void => {
    timer = clock.setTimeout(check, ms);
  };
  // First in line: a reply ssh2 writes while parsing these bytes already pays the debt.
  transport.prependListener('data', () => {
    if (owed) return;
    owed = true;
    since = clock.now();
    if (timer === null) arm(delayMs);
  });
  transport.once('close', () => {
    if (timer !== null) clock.clearTimeout(timer);
    timer = null;
  });
}
