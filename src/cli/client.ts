// The HTTP client of the commands that talk to a running gateway (plan, apply, status): the
// shared --url / --token-file flags, one undici Agent per command run, and the API's JSON
// shapes. Every failure becomes a ClientError whose message is one line a user can act on.

import { readFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import type { Plan } from '../api/runtime.js';
import type { LoopStatus } from '../reconcilers/types.js';
import { formatIssue, type SpecIssue } from '../spec/index.js';
import type { Io } from './command.js';
import { UsageError } from './command.js';

export const DEFAULT_URL = 'http://127.0.0.1:8000';
const REQUEST_TIMEOUT_MS = 60_000; // a dry run of 10,000 services renders every file

/** parseArgs options every client command takes. */
export const CLIENT_OPTIONS = {
  url: { type: 'string' },
  'token-file': { type: 'string' },
} as const;

export const CLIENT_HELP = `  --url URL           the gateway's API (default: env DSTACK_PROXY_URL or ${DEFAULT_URL})
  --token-file FILE   file holding the API token, sent as Authorization: Bearer
                      (default: env DSTACK_PROXY_TOKEN_FILE; none)`;

/** PUT /api/v1/state (with or without ?dryRun=true). */
export interface PutStateResponse {
  generation: number;
  hash: string;
  changed: boolean;
  dryRun?: boolean;
  plan: Plan;
}

/** GET /api/v1/status. */
export interface StatusResponse {
  generation: number;
  hash: string;
  ready: boolean;
  observedGeneration: number;
  loops: Record<string, LoopStatus>;
}

/** A failed call: `issues` holds the document's problems on 422 (and 400/413). */
export class ClientError extends Error {
  readonly status: number | undefined;
  readonly code: string | undefined;
  readonly issues: SpecIssue[];

  constructor(message: string, opts: { status?: number; code?: string; issues?: SpecIssue[] } = {}) {
    super(message);
    this.name = 'ClientError';
    this.status = opts.status;
    this.code = opts.code;
    this.issues = opts.issues ?? [];
  }
}

export interface Client {
  readonly url: string;
  putState(body: string, opts: { yaml: boolean; dryRun: boolean; ifMatch?: number }): Promise<PutStateResponse>;
  status(): Promise<StatusResponse>;
  close(): Promise<void>;
}

/** A failed call as the commands print it: the document's problems one a line, else the one message. */
export function printClientError(command: string, err: ClientError, io: Io): void {
  if (err.issues.length > 0) {
    io.stderr(`dstack-proxy ${command}: the gateway rejected the document:\n`);
    for (const issue of err.issues) io.stderr(`${formatIssue(issue)}\n`);
  } else {
    io.stderr(`dstack-proxy ${command}: ${err.message}\n`);
  }
}

/**
 * Run `use` with an open client and close the client after. A ClientError is printed
 * (printClientError) and exits 1; any other error is a bug and propagates.
 */
export async function withClient(command: string, client: Client, io: Io, use: (client: Client) => Promise<number>): Promise<number> {
  try {
    return await use(client);
  } catch (err) {
    if (!(err instanceof ClientError)) throw err;
    printClientError(command, err, io);
    return 1;
  } finally {
    await client.close();
  }
}

/** Resolve --url and --token-file (flags, then env) and open a client. */
export async function openClient(values: { url?: string | undefined; 'token-file'?: string | undefined }, io: Io): Promise<Client> {
  const raw = values.url ?? io.env.DSTACK_PROXY_URL ?? DEFAULT_URL;
  let base: URL;
  try {
    base = new URL(raw);
  } catch {
    throw new UsageError(`--url ${JSON.stringify(raw)} is not a URL (e.g. ${DEFAULT_URL})`);
  }
  if (base.protocol !== 'http:' && base.protocol !== 'https:') throw new UsageError(`--url must be http:// or https://; got ${raw}`);
  const tokenFile = values['token-file'] ?? io.env.DSTACK_PROXY_TOKEN_FILE;
  const token = tokenFile ? await readToken(tokenFile) : undefined;
  return createClient(base, token);
}

async function readToken(file: string): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new UsageError(`cannot read --token-file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  const token = text.trim();
  if (!token) throw new UsageError(`--token-file ${file} is empty`);
  return token;
}

function createClient(base: URL, token: string | undefined): Client {
  const agent = new Agent({ headersTimeout: REQUEST_TIMEOUT_MS, bodyTimeout: REQUEST_TIMEOUT_MS, connect: { timeout: 10_000 } });
  const origin = base.toString().replace(/\/+$/, '');
  const auth: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};

  async function call<T>(method: 'GET' | 'PUT', path: string, headers: Record<string, string>, body?: string): Promise<T> {
    const url = `${origin}${path}`;
    let res: Awaited<ReturnType<typeof request>>;
    try {
      res = await request(url, {
        method,
        headers: { accept: 'application/json', ...auth, ...headers },
        body: body ?? null,
        dispatcher: agent,
      });
    } catch (err) {
      throw new ClientError(connectionMessage(err, origin));
    }
    const text = await res.body.text();
    let data: unknown;
    try {
      data = text ? JSON.parse(text) : undefined;
    } catch {
      throw new ClientError(`${method} ${url}: HTTP ${res.statusCode}, not JSON: ${text.slice(0, 200)}`, { status: res.statusCode });
    }
    if (res.statusCode >= 200 && res.statusCode < 300) return data as T;
    throw errorFromBody(res.statusCode, data, token !== undefined);
  }

  return {
    url: origin,
    putState: (body, o) =>
      call<PutStateResponse>(
        'PUT',
        `/api/v1/state${o.dryRun ? '?dryRun=true' : ''}`,
        {
          'content-type': o.yaml ? 'application/yaml' : 'application/json',
          ...(o.ifMatch === undefined ? {} : { 'if-match': String(o.ifMatch) }),
        },
        body,
      ),
    status: () => call<StatusResponse>('GET', '/api/v1/status', {}),
    close: () => agent.close(),
  };
}

function connectionMessage(err: unknown, origin: string): string {
  const e = err as NodeJS.ErrnoException & { cause?: NodeJS.ErrnoException };
  const code = e.code ?? e.cause?.code;
  switch (code) {
    case 'ECONNREFUSED':
      return `cannot connect to the gateway at ${origin}: connection refused (is \`dstack-proxy gateway\` running? set --url or DSTACK_PROXY_URL)`;
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `cannot connect to the gateway at ${origin}: host not found`;
    case 'UND_ERR_CONNECT_TIMEOUT':
      return `cannot connect to the gateway at ${origin}: connection timed out`;
    case 'UND_ERR_HEADERS_TIMEOUT':
    case 'UND_ERR_BODY_TIMEOUT':
      return `the gateway at ${origin} did not answer within ${REQUEST_TIMEOUT_MS / 1000}s`;
    default:
      return `request to the gateway at ${origin} failed: ${code ? `${code} ` : ''}${e.message}`;
  }
}

function errorFromBody(status: number, data: unknown, sentToken: boolean): ClientError {
  const body = (typeof data === 'object' && data !== null ? data : {}) as { code?: unknown; message?: unknown; errors?: unknown };
  const code = typeof body.code === 'string' ? body.code : undefined;
  const message = typeof body.message === 'string' ? body.message : `HTTP ${status}`;
  const issues = Array.isArray(body.errors)
    ? body.errors.filter((i): i is SpecIssue => typeof i === 'object' && i !== null && typeof (i as SpecIssue).message === 'string')
    : [];
  let text = `${message}${code ? ` (${code}, HTTP ${status})` : ` (HTTP ${status})`}`;
  if (status === 401)
    text += sentToken ? '; the token in --token-file was refused' : '; pass --token-file FILE (or DSTACK_PROXY_TOKEN_FILE)';
  return new ClientError(text, { status, ...(code ? { code } : {}), issues });
}
