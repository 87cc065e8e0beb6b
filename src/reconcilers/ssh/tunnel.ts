// One replica's SSH tunnel with its lifecycle: hold a connection along its hop chain (its own,
// or one shared with tunnels that would open an identical one: shared-chains.ts) → probe a
// channel to the app port → Ready. Lost connections (socket closed, keepalive missed) reconnect
// with exponential backoff and jitter until close(). The app port is probed again every
// probeIntervalMs, and at once after a channel open failed.

import type { Duplex } from 'node:stream';
import { nextDelay, type BackoffPolicy } from '../backoff.js';
import type { Clock, TimerHandle } from '../../clock.js';
import type { HostKeyScope } from './host-keys.js';
import type { ChainLease, SharedChains } from './shared-chains.js';
import { forwardOut, safeMessage, SshConnectError } from './ssh-chain.js';
import type { ReplicaTarget } from './targets.js';

export type TunnelReason =
  'Connecting' | 'Connected' | 'ConnectFailed' | 'AuthFailed' | 'HostKeyMismatch' | 'AppPortUnreachable' | 'InvalidConfig';

export interface TunnelState {
  ready: boolean;
  reason: TunnelReason;
  message: string;
}

export interface TunnelOptions {
  target: Extract<ReplicaTarget, { kind: 'ssh' }>;
  /** Where connections come from (and are shared). */
  chains: SharedChains;
  /** The replica's host-key policy and id. */
  hostKeyScope: HostKeyScope;
  clock: Clock;
  reconnect: BackoffPolicy;
  random: () => number;
  probeIntervalMs: number;
  channelOpenTimeoutMs: number;
  onState: (state: TunnelState) => void;
  /** Called every time the tunnel holds a connection of the whole chain again. */
  onConnected?: () => void;
}

export class ReplicaTunnel {
  readonly #o: TunnelOptions;
  #lease: ChainLease | null = null;
  #state: TunnelState = { ready: false, reason: 'Connecting', message: 'connecting' };
  #attempts = 0;
  #timer: TimerHandle | null = null;
  #probeTimer: TimerHandle | null = null;
  #closed = false;
  #epoch = 0; // bumps on every teardown: late callbacks of an old connection are ignored

  constructor(o: TunnelOptions) {
    this.#o = o;
  }

  get state(): TunnelState {
    return this.#state;
  }

  isReady(): boolean {
    return this.#state.ready;
  }

  start(): void {
    void this.#connect();
  }

  /**
   * A channel to the app port; marks the replica unreachable when it fails.
   *
   * Opened on demand, not from a pool of pre-opened channels. Measured through the SSH data path: a pool
   * does not raise requests/s (the machine is CPU-bound and an open costs the same CPU whenever
   * it happens), and it needs care: sshd sets no TCP_NODELAY on a connection without a tty, so
   * its unsolicited CHANNEL_OPEN_CONFIRMATION followed by response data stalled 40 ms on our
   * delayed ACK until something was sent back after each confirmation (ackPromptly in
   * prompt-ack.ts now does that for every connection).
   */
  async open(): Promise<Duplex> {
    const last = this.#lease?.clients.at(-1);
    if (!this.#state.ready || last === undefined) throw new Error('replica is not ready');
    const epoch = this.#epoch;
    try {
      return await forwardOut(last, this.#o.target.appHost, this.#o.target.appPort, this.#o.channelOpenTimeoutMs, this.#o.clock);
    } catch (err) {
      if (epoch === this.#epoch && !this.#closed) {
        this.#set({ ready: false, reason: 'AppPortUnreachable', message: this.#appMessage(err) });
        this.#scheduleProbe(0);
      }
      throw err;
    }
  }

  /** Closes the connection for good; no reconnect. */
  close(): void {
    this.#closed = true;
    this.#teardown();
  }

  async #connect(): Promise<void> {
    if (this.#closed) return;
    const epoch = ++this.#epoch;
    try {
      const lease = await this.#o.chains.acquire(this.#o.target.hops, this.#o.hostKeyScope, (why) => this.#lost(epoch, why));
      if (this.#closed || epoch !== this.#epoch) {
        lease.release();
        return;
      }
      this.#lease = lease;
      this.#attempts = 0;
      this.#o.onConnected?.();
      await this.#probe(epoch);
    } catch (err) {
      if (this.#closed || epoch !== this.#epoch) return;
      const reason = err instanceof SshConnectError ? err.reason : 'ConnectFailed';
      this.#retry(reason, safeMessage(err));
    }
  }

  #lost(epoch: number, why: string): void {
    if (this.#closed || epoch !== this.#epoch) return;
    this.#teardown();
    this.#retry('ConnectFailed', `connection lost: ${why}`);
  }

  #retry(reason: TunnelReason, message: string): void {
    const delay = nextDelay(++this.#attempts, this.#o.reconnect, this.#o.random);
    this.#set({ ready: false, reason, message: `${message}; retrying in ${Math.round(delay / 100) / 10} s` });
    this.#timer = this.#o.clock.setTimeout(() => {
      this.#timer = null;
      void this.#connect();
    }, delay);
  }

  async #probe(epoch: number): Promise<void> {
    const last = this.#lease?.clients.at(-1);
    if (last === undefined || epoch !== this.#epoch || this.#closed) return;
    const { appHost, appPort } = this.#o.target;
    try {
      const ch = await forwardOut(last, appHost, appPort, this.#o.channelOpenTimeoutMs, this.#o.clock);
      ch.close();
      if (epoch !== this.#epoch || this.#closed) return;
      this.#set({ ready: true, reason: 'Connected', message: `connected; ${appHost}:${appPort} accepts connections` });
    } catch (err) {
      if (epoch !== this.#epoch || this.#closed) return;
      this.#set({ ready: false, reason: 'AppPortUnreachable', message: this.#appMessage(err) });
    }
    this.#scheduleProbe(this.#o.probeIntervalMs);
  }

  #scheduleProbe(ms: number): void {
    if (this.#probeTimer !== null) this.#o.clock.clearTimeout(this.#probeTimer);
    const epoch = this.#epoch;
    this.#probeTimer = this.#o.clock.setTimeout(() => {
      this.#probeTimer = null;
      void this.#probe(epoch);
    }, ms);
  }

  #appMessage(err: unknown): string {
    const { appHost, appPort } = this.#o.target;
    return `connected, but ${appHost}:${appPort} on the replica refuses channels: ${safeMessage(err)}`;
  }

  #teardown(): void {
    this.#epoch++;
    for (const t of [this.#timer, this.#probeTimer]) if (t !== null) this.#o.clock.clearTimeout(t);
    this.#timer = this.#probeTimer = null;
    this.#lease?.release();
    this.#lease = null;
  }

  #set(s: TunnelState): void {
    const prev = this.#state;
    this.#state = s;
    if (prev.ready !== s.ready || prev.reason !== s.reason || prev.message !== s.message) this.#o.onState(s);
  }
}
