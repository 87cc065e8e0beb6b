// Who the model API says the client is, for the per-client rate limits on the internal listener:
// the entrypoint site's X-Real-IP only with the entrypoint key, else the connection's peer.

import { describe, expect, it } from 'vitest';
import { entrypointClient, peerClient } from '../../src/models/forwarders.js';

const KEY = 'a'.repeat(64);
const req = (remoteAddress: string | undefined, headers: Record<string, string>) => ({ socket: { remoteAddress }, headers });

describe('peerClient', () => {
  it.each([
    ['an IPv4 peer', '127.0.0.2', {}, { address: '127.0.0.2', forwardedFor: '127.0.0.2' }],
    ['an IPv4-mapped peer', '::ffff:10.0.0.1', {}, { address: '10.0.0.1', forwardedFor: '10.0.0.1' }],
    ['an IPv6 peer', '::1', {}, { address: '::1', forwardedFor: '::1' }],
    [
      'a peer that sent X-Real-IP and X-Forwarded-For',
      '127.0.0.2',
      { 'x-real-ip': '203.0.113.1', 'x-forwarded-for': '203.0.113.1' },
      { address: '127.0.0.2', forwardedFor: '203.0.113.1, 127.0.0.2' },
    ],
  ])('%s', (_name, peer, headers, want) => {
    expect(peerClient(req(peer, headers))).toMatchObject({ ...want, proto: 'http' });
  });
});

describe('entrypointClient', () => {
  const clientOf = entrypointClient(KEY);
  const site = { 'x-real-ip': '198.51.100.4', 'x-forwarded-for': '10.9.9.9, 198.51.100.4', 'x-forwarded-proto': 'https' };
  it('takes the address the entrypoint site saw when the key is right', () => {
    expect(clientOf(req('127.0.0.1', { ...site, 'x-dstack-entrypoint-key': KEY }))).toMatchObject({
      address: '198.51.100.4',
      forwardedFor: '10.9.9.9, 198.51.100.4',
      proto: 'https',
    });
  });
  it.each([
    ['without the key', site],
    ['with a wrong key', { ...site, 'x-dstack-entrypoint-key': 'b'.repeat(64) }],
    ['with a key of another length', { ...site, 'x-dstack-entrypoint-key': 'short' }],
    ['with the key and an X-Real-IP that is no address', { ...site, 'x-real-ip': 'unix:', 'x-dstack-entrypoint-key': KEY }],
  ])('falls back to the peer %s', (_name, headers) => {
    expect(clientOf(req('127.0.0.3', headers))).toMatchObject({ address: '127.0.0.3', proto: 'http' });
  });
});
