// Shared pieces of the dstack compatibility suites: a gateway with --dstack-compat true on free
// loopback ports (its private Nginx), a client that posts as dstack's server does (JSON, no
// token), and readers for the stored generation and `services/list`.

import type { GatewayDeps } from '../../../src/daemon/gateway.js';
import { api, type TestGateway } from '../../helpers/gateway.js';
import { startGatewayWith } from '../../e2e/integration-harness.js';
import { dstackPaths } from './fixtures.js';

export async function startCompatGateway(flags: Record<string, string> = {}, deps: GatewayDeps = {}): Promise<TestGateway> {
  return startGatewayWith({ dstackCompat: 'true', ...flags }, deps);
}

export interface DstackReply {
  status: number;
  json: unknown;
  body: string;
}

/** A POST (a body, or none for the unregisters) or a GET, as dstack's GatewayClient sends it. */
export async function dstack(t: TestGateway, path: string, body?: unknown, method = 'POST'): Promise<DstackReply> {
  const r = await api(t, { method, path, ...(body !== undefined ? { body } : {}) });
  return { status: r.status, json: r.json, body: r.body };
}

export async function generation(t: TestGateway): Promise<number> {
  return (await t.gw.store.read()).generation;
}

export interface Listed {
  id: string | null;
  project_name: string;
  run_name: string;
  replicas: { id: string }[];
}

export async function listed(t: TestGateway): Promise<Listed[]> {
  const r = await api(t, { path: dstackPaths.list });
  if (r.status !== 200) throw new Error(`services/list answered ${r.status}: ${r.body}`);
  return (r.json as { services: Listed[] }).services;
}
