// Bearer token for the management routes (state, status, stats, metrics), compared in constant
// time, and the start-up rule that keeps management from being open to the network by accident.

import { createHash, timingSafeEqual } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import { readFile, stat } from 'node:fs/promises';
import { BlockList, isIP } from 'node:net';
import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { ProxyError } from '../errors.js';

export function tokenGuard(token: string | undefined): (request: FastifyRequest) => Promise<void> {
  if (token === undefined) return async () => {};
  const expected = digest(token);
  return async (request) => {
    const given = presented(request.headers.authorization);
    if (given === undefined || !timingSafeEqual(digest(given), expected)) {
      throw new ProxyError('DP_ERR_UNAUTHORIZED', 'send the API token as Authorization: Bearer <token>');
    }
  };
}

/**
 * The token an Authorization header carries: `Bearer <token>`, or `Basic` with the token as the
 * password (any user name), which is what a browser sends for the status page once asked.
 */
function presented(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  if (header.startsWith('Bearer ')) return header.slice(7).trim();
  if (!header.startsWith('Basic ')) return undefined;
  const pair = Buffer.from(header.slice(6).trim(), 'base64').toString('utf8');
  const colon = pair.indexOf(':');
  return colon === -1 ? undefined : pair.slice(colon + 1);
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Read --api-token-file: at least 16 characters; warns when the file is readable by others. */
export async function readApiToken(file: string, logger: Logger): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new ProxyError(
      'DP_ERR_BAD_OPTION',
      `cannot read --api-token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`,
    );
  }
  const token = text.trim();
  if (token.length < 16) throw new ProxyError('DP_ERR_BAD_OPTION', `--api-token-file ${file}: the token must be at least 16 characters`);
  if (((await stat(file)).mode & 0o077) !== 0) logger.warn({ file }, 'the API token file is readable by group or others; chmod 600 it');
  return token;
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** An address of the loopback interface: 127.0.0.0/8 or ::1, in any spelling (IPv4-mapped included). */
export function isLoopbackAddress(address: string | undefined): boolean {
  const family = address ? isIP(address) : 0;
  return family !== 0 && LOOPBACK.check(address!, family === 4 ? 'ipv4' : 'ipv6');
}

/**
 * Does listening on `host` reach the loopback interface only? An IP literal is judged as it is;
 * a name (`localhost`) by every address it resolves to, as the listener would bind the first
 * of them. A wildcard (0.0.0.0, ::) or a name that does not resolve is not loopback.
 */
export async function listensOnLoopbackOnly(host: string): Promise<boolean> {
  const h = host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
  if (isIP(h)) return isLoopbackAddress(h);
  try {
    const addresses = await lookup(h, { all: true });
    return addresses.length > 0 && addresses.every((a) => isLoopbackAddress(a.address));
  } catch {
    return false;
  }
}

export interface ManagementExposure {
  /** What listens there, for the message: "the management API". */
  what: string;
  /** The listen address. */
  host: string;
  port: number;
  /** The flags that fix it, for the message. */
  hostFlag: string;
  tokenFlag: string;
  insecureFlag: string;
  /** Another way out the message names (the in-server proxy's --api-port). */
  alternative?: string;
  hasToken: boolean;
  insecure: boolean;
}

/**
 * Management routes rewrite all routing: without a token they are served on a loopback address
 * only (a control server on the same host, or one that comes in through an SSH tunnel). A
 * non-loopback address without a token is refused unless the operator says so explicitly.
 */
export async function checkManagementExposure(e: ManagementExposure, logger: Logger): Promise<void> {
  if (e.hasToken || (await listensOnLoopbackOnly(e.host))) return;
  if (e.insecure) {
    logger.warn({ host: e.host, port: e.port }, `${e.what} is open without a token on a non-loopback address (${e.insecureFlag})`);
    return;
  }
  const ways = [`Give ${e.tokenFlag} FILE`, `listen on loopback (${e.hostFlag} 127.0.0.1)`, ...(e.alternative ? [e.alternative] : [])];
  throw new ProxyError(
    'DP_ERR_OPEN_API',
    `refusing to start (DP_ERR_OPEN_API): ${e.what} would listen on ${e.host}, not a loopback address, without an API token, ` +
      `so anyone who can reach it could rewrite all routing. ${ways.join(', or ')}; ` +
      `${e.insecureFlag} serves it open anyway (only behind a firewall you trust)`,
  );
}

/**
 * onRequest hook for routes meant for this host's own Nginx (the auth_request target): a client
 * elsewhere must not get an oracle for project tokens when the API listens beyond loopback.
 * "This host" is a loopback peer, a peer whose address is the one it connected to (Nginx
 * calling an API bound to one of the host's own addresses), or any peer of a Unix socket.
 */
export async function thisHostOnly(request: FastifyRequest): Promise<void> {
  const { remoteAddress, localAddress } = request.raw.socket;
  if (isLoopbackAddress(remoteAddress) || (remoteAddress !== undefined && remoteAddress === localAddress)) return;
  if (remoteAddress === undefined && typeof request.server.server.address() === 'string') return;
  throw new ProxyError('DP_ERR_FORBIDDEN', 'this endpoint answers clients on this host only');
}
