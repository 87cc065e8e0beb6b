// HTTP-01 challenges across replicas behind one name (`--acme-challenge-peers`): dstack
// registers each replica of a replicated gateway on its own, and each one runs certbot for the
// shared domain; Let's Encrypt's request for a replica's token may land on any of them. A
// challenge file missing from this gateway's webroot reaches here (Nginx's named location), and
// is asked of every peer at once: the first that has it answers. A question from a peer carries
// ASK_HEADER and is answered 404 here, after Nginx looked in this webroot, so no question goes
// round the ring. A fleet sharing its certificates through its database (`--db postgres://…`)
// comes here too: the key authorization whichever gateway ordered is in that database.

import http from 'node:http';
import https from 'node:https';
import type { FastifyPluginAsync } from 'fastify';
import { ProxyError } from '../errors.js';

/** Marks a peer's question: only the webroot answers it. */
export const ASK_HEADER = 'x-dstack-proxy-acme-peer';
/** ACME tokens are base64url (RFC 8555 §8.3); anything else is never asked about. */
const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;
/** A key authorization: the token, a dot, the account key's thumbprint (base64url). */
const KEY_AUTHORIZATION = /^[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}$/;
/** A peer that has not answered by then is not waited for. */
const PEER_TIMEOUT_MS = 3_000;

/** `--acme-challenge-peers`: http(s)://host[:port] URLs, comma-separated; a bad one is refused with its position. */
export function parseAcmePeers(text: string | undefined): string[] {
  if (text === undefined || text.trim() === '') return [];
  return text.split(',').map((raw, i) => {
    const s = raw.trim();
    let u: URL;
    try {
      u = new URL(s);
    } catch {
      throw new ProxyError('DP_ERR_BAD_OPTION', `--acme-challenge-peers: entry ${i + 1} (${JSON.stringify(s)}) is not a URL`);
    }
    if (
      (u.protocol !== 'http:' && u.protocol !== 'https:') ||
      u.username ||
      u.password ||
      (u.pathname !== '/' && u.pathname !== '') ||
      u.search ||
      u.hash
    ) {
      throw new ProxyError(
        'DP_ERR_BAD_OPTION',
        `--acme-challenge-peers: entry ${i + 1} (${JSON.stringify(s)}) must be http(s)://host[:port], without credentials or a path`,
      );
    }
    return u.origin;
  });
}

/** The peer's answer for `token` under `host`, or null (not found, an error, a timeout, not a key authorization). */
function ask(peer: string, host: string, token: string, signal: AbortSignal): Promise<string | null> {
  return new Promise((resolve) => {
    const u = new URL(`/.well-known/acme-challenge/${token}`, peer);
    const get = u.protocol === 'https:' ? https.get : http.get;
    const req = get(u, { headers: { host, [ASK_HEADER]: '1' }, signal, rejectUnauthorized: false }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        return resolve(null);
      }
      let body = '';
      res.setEncoding('latin1');
      res.on('data', (d: string) => {
        body += d;
        if (body.length > 512) req.destroy();
      });
      res.on('end', () => {
        const text = body.trim();
        resolve(KEY_AUTHORIZATION.test(text) && text.startsWith(`${token}.`) ? text : null);
      });
      res.on('error', () => resolve(null));
    });
    req.on('error', () => resolve(null));
  });
}

export interface AcmeChallengeRouteOptions {
  peers: readonly string[];
  /** A fleet's store of key authorizations, asked before any peer. */
  stored?: (token: string) => Promise<string | null>;
}

export const acmePeerRoutes: FastifyPluginAsync<AcmeChallengeRouteOptions> = async (app, { peers, stored }) => {
  app.get<{ Params: { token: string } }>('/.well-known/acme-challenge/:token', async (req, reply) => {
    const token = req.params.token;
    const host = (req.headers.host ?? '').replace(/:\d+$/, '');
    const notFound = (): unknown => reply.code(404).type('text/plain').send('not found\n');
    if (req.headers[ASK_HEADER] !== undefined || !TOKEN.test(token) || host === '') return notFound();
    if (stored) {
      const answer = await stored(token).catch((err: unknown) => {
        req.log.warn({ err: (err as Error).message }, 'the certificate store does not answer for an ACME challenge');
        return null;
      });
      if (answer !== null && KEY_AUTHORIZATION.test(answer) && answer.startsWith(`${token}.`)) {
        req.log.info({ token, host }, 'answered an ACME challenge from the certificate store');
        return reply.type('text/plain').send(answer);
      }
    }
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), PEER_TIMEOUT_MS);
    try {
      const answer = await new Promise<string | null>((resolve) => {
        let left = peers.length;
        if (left === 0) return resolve(null);
        for (const peer of peers) {
          void ask(peer, host, token, controller.signal).then((a) => {
            if (a !== null) resolve(a);
            else if (--left === 0) resolve(null);
          });
        }
      });
      if (answer === null) return notFound();
      req.log.info({ token, host }, 'answered an ACME challenge from a peer');
      return reply.type('text/plain').send(answer);
    } finally {
      clearTimeout(timer);
      controller.abort();
    }
  });
};
