// A dedicated PostgreSQL connection that LISTENs on the state channel and reconnects with
// backoff when the database goes away (restart, failover, network). Every (re)connect is
// followed by onConnected(), so a change committed while we were disconnected is not missed.

import pg from 'pg';
import { systemClock, type Clock, type TimerHandle } from '../clock.js';

export interface ListenerOptions {
  config: pg.ClientConfig;
  channel: string;
  onNotify: (payload: string) => void;
  onConnected: () => void;
  onLost: (err: unknown) => void;
  /** First reconnect delay; doubles up to maxDelayMs. Default 100 ms. */
  initialDelayMs?: number;
  /** Default 5 s. */
  maxDelayMs?: number;
  /** Runs the reconnect backoff. Default systemClock (unref'd: a pending reconnect never holds the process). */
  clock?: Clock;
}

export const RECONNECT_INITIAL_DELAY_MS = 100;
export const RECONNECT_MAX_DELAY_MS = 5_000; // 5 s

export class PgListener {
  private client: pg.Client | undefined;
  private attempt = 0;
  private timer: TimerHandle | undefined;
  private stopped = false;
  private readonly clock: Clock;

  constructor(private readonly options: ListenerOptions) {
    this.clock = options.clock ?? systemClock;
  }

  start(): void {
    void this.connect();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    const client = new pg.Client({ ...this.options.config, keepAlive: true });
    let lost = false;
    const onLost = (err: unknown): void => {
      if (lost) return;
      lost = true;
      if (this.client === client) this.client = undefined;
      client.removeAllListeners('notification');
      void client.end().catch(() => undefined);
      if (this.stopped) return;
      this.options.onLost(err);
      this.scheduleReconnect();
    };
    client.on('error', onLost);
    client.on('end', () => onLost(new Error('the LISTEN connection ended')));
    client.on('notification', (msg) => {
      if (msg.channel === this.options.channel) this.options.onNotify(msg.payload ?? '');
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${pg.escapeIdentifier(this.options.channel)}`);
    } catch (err) {
      onLost(err);
      return;
    }
    if (this.stopped || lost) {
      await client.end().catch(() => undefined);
      return;
    }
    this.client = client;
    this.attempt = 0;
    this.options.onConnected();
  }

  private scheduleReconnect(): void {
    if (this.stopped || this.timer !== undefined) return;
    const initial = this.options.initialDelayMs ?? RECONNECT_INITIAL_DELAY_MS;
    const max = this.options.maxDelayMs ?? RECONNECT_MAX_DELAY_MS;
    const delay = Math.min(max, initial * 2 ** this.attempt) * (0.8 + Math.random() * 0.4);
    this.attempt++;
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      void this.connect();
    }, delay);
  }
}
