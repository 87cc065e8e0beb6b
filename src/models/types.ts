// The shapes the model API's plugin, its forwarders and the upstream exchange share: a chat
// request on its way to a replica, the answer coming back, and the client's abort.

import { EventEmitter } from 'node:events';
import type { Readable } from 'node:stream';
import type { Service } from '../spec/types.js';

export interface UpstreamRequest {
  /** Path on the replica, e.g. `/v1/chat/completions` or `/generate_stream`. */
  path: string;
  body: Buffer | string;
  /** Aborted when the client goes away: the replica stops generating. */
  signal: ClientAbort;
  /** Who asked: the Nginx forwarder passes it on so that per-client limits apply. */
  client?: ForwardedClient;
}

/** The client of a model API request, as the forwarder passes it on. */
export interface ForwardedClient {
  /** The client's IP address. */
  address: string;
  /** The forwarding chain, ending with `address`. */
  forwardedFor: string;
  /** 'http' or 'https', as the client spoke to the first hop. */
  proto: string;
  /** The client's request headers (lower-case names), for limits keyed by a header. */
  headers: Record<string, string | string[] | undefined>;
}

/**
 * Emits 'abort' once when the client goes away. An EventEmitter rather than an AbortController:
 * creating one and listening on its signal cost more CPU per request than the rest of the
 * plugin's own work.
 */
export class ClientAbort extends EventEmitter {
  aborted = false;

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.emit('abort');
  }
}

export interface UpstreamResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /**
   * A Readable that streams as the replica sends (consume or destroy it), or a Buffer when the
   * forwarder read a small answer whole.
   */
  body: Readable | Buffer;
}

export interface Forwarder {
  forward(service: Service, request: UpstreamRequest): Promise<UpstreamResponse>;
  close(): Promise<void>;
}

export interface ForwarderTimeouts {
  /** Time to the response headers: beyond it the client gets 504. Default 300 s (dstack's proxy_read_timeout). */
  headersTimeoutMs?: number;
  /** Longest silence inside a body (between tokens). Default 300 s. */
  bodyTimeoutMs?: number;
}
