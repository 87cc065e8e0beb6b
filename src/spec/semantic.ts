// Rules the JSON Schema cannot say: duplicates, references, one-of-two fields, and the
// injection-safe shapes of everything that reaches an Nginx file, each with a sentence.
// Runs on a schema-valid document, so paths point into the document as submitted.

import { HEADER_PATTERN, PREFIX_PATTERN } from './schema.js';
import type { ProxyStateInput } from './input.js';
import type { SpecIssue } from './issues.js';
import { MAX_SERVICES } from './types.js';
import { privateKeyReader, usablePrivateKey } from './keys.js';

/** Why a private key cannot be used by the SSH loop, or null; never any part of the key. */
export function privateKeyProblem(key: string, read = usablePrivateKey): string | null {
  const usable = read(key);
  return usable.ok ? null : usable.problem;
}

const PREFIX_RE = new RegExp(PREFIX_PATTERN);
const HEADER_RE = new RegExp(HEADER_PATTERN);
const LABEL_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** Why a string is not an RFC 1123 host name, or null when it is one. */
export function domainProblem(domain: string): string | null {
  if (domain.length === 0) return 'must not be empty';
  if (domain.length > 253) return `must be at most 253 characters long; got ${domain.length}`;
  if (/[^\x21-\x7e]/.test(domain)) {
    return /[\s]/.test(domain)
      ? 'must not contain spaces or line breaks'
      : 'must be ASCII: write an internationalised name in punycode (xn--…)';
  }
  const bad = /[^A-Za-z0-9.-]/.exec(domain);
  if (bad) {
    return bad[0] === '*'
      ? 'must not be a wildcard'
      : `must be a host name (letters, digits, '-' and '.'); ${JSON.stringify(bad[0])} is not allowed`;
  }
  if (domain.endsWith('.')) return 'must not end with a dot';
  for (const label of domain.toLowerCase().split('.')) {
    if (label.length === 0) return 'must not contain an empty label (two dots in a row or a leading dot)';
    if (label.length > 63) return `has a label longer than 63 characters ("${label.slice(0, 20)}…")`;
    if (!LABEL_RE.test(label)) return `has a label that starts or ends with '-' ("${label}")`;
  }
  return null;
}

export function prefixProblem(prefix: string): string | null {
  if (PREFIX_RE.test(prefix)) return null;
  if (!prefix.startsWith('/')) return "must start with '/'";
  return `must not contain spaces, control characters, quotes, '\\', '{', '}', ';', '$' or '#'; got ${JSON.stringify(prefix)}`;
}

export function headerProblem(header: string): string | null {
  if (HEADER_RE.test(header)) return null;
  return `must be an HTTP header name of 1-64 letters, digits and '-'; got ${JSON.stringify(header)}`;
}

export function semanticIssues(doc: ProxyStateInput): SpecIssue[] {
  const issues: SpecIssue[] = [];
  const add = (path: string, message: string): void => {
    issues.push({ path, message });
  };
  const spec = doc.spec;
  const readKey = privateKeyReader();
  const projects = spec.projects ?? [];
  const services = spec.services ?? [];
  const entrypoints = spec.entrypoints ?? [];

  if (services.length > MAX_SERVICES) {
    add('/spec/services', `has ${services.length} services; the limit is ${MAX_SERVICES}.`);
    return issues;
  }

  // Projects: unique names (case-insensitive, as they are normalised to lower case).
  const projectKeys = new Map<string, { index: number; hasKey: boolean }>();
  projects.forEach((p, i) => {
    const name = p.name.toLowerCase();
    const first = projectKeys.get(name);
    if (first) add(`/spec/projects/${i}/name`, `duplicates project "${name}" of /spec/projects/${first.index}.`);
    else projectKeys.set(name, { index: i, hasKey: p.sshPrivateKey !== undefined });
    const keyProblem = p.sshPrivateKey === undefined ? null : privateKeyProblem(p.sshPrivateKey, readKey);
    if (keyProblem) add(`/spec/projects/${i}/sshPrivateKey`, `${keyProblem}.`);
  });

  // Domains: one owner across services and entrypoints.
  const domains = new Map<string, string>();
  const checkDomain = (domain: string, path: string): void => {
    const problem = domainProblem(domain);
    if (problem) {
      add(path, `${problem}.`);
      return;
    }
    const d = domain.toLowerCase();
    const owner = domains.get(d);
    if (owner) add(path, `duplicates domain "${d}" of ${owner}.`);
    else domains.set(d, path);
  };

  const serviceKeys = new Map<string, number>();
  const replicaIds = new Map<string, string>();
  services.forEach((s, i) => {
    const at = `/spec/services/${i}`;
    const key = `${s.project.toLowerCase()}/${s.run.toLowerCase()}`;
    const first = serviceKeys.get(key);
    if (first !== undefined) add(`${at}/run`, `duplicates service "${key}" of /spec/services/${first}.`);
    else serviceKeys.set(key, i);

    const project = projectKeys.get(s.project.toLowerCase());
    if (!project) add(`${at}/project`, `names project "${s.project.toLowerCase()}", which is not in /spec/projects.`);
    if (s.domain !== undefined) checkDomain(s.domain, `${at}/domain`);

    const limits = new Set<string>();
    (s.rateLimits ?? []).forEach((r, j) => {
      const rat = `${at}/rateLimits/${j}`;
      const prefix = prefixProblem(r.prefix);
      if (prefix) add(`${rat}/prefix`, `${prefix}.`);
      if (r.key.type === 'header') {
        if (r.key.header === undefined) add(`${rat}/key/header`, "is required when key.type is 'header'.");
        else {
          const header = headerProblem(r.key.header);
          if (header) add(`${rat}/key/header`, `${header}.`);
        }
      } else if (r.key.header !== undefined) {
        add(`${rat}/key/header`, "is only allowed when key.type is 'header'.");
      }
      const id = `${r.prefix}\u0000${r.key.type}\u0000${(r.key.header ?? '').toLowerCase()}`;
      if (limits.has(id)) add(rat, 'duplicates another rate limit of this service with the same prefix and key.');
      limits.add(id);
    });

    if (s.model) {
      const m = s.model;
      if (m.format === 'openai') {
        if (m.prefix !== undefined) {
          const prefix = prefixProblem(m.prefix);
          if (prefix) add(`${at}/model/prefix`, `${prefix}.`);
        }
        if (m.chatTemplate !== undefined) add(`${at}/model/chatTemplate`, "is only allowed with format 'tgi'.");
        if (m.eosToken !== undefined) add(`${at}/model/eosToken`, "is only allowed with format 'tgi'.");
        if (m.bosToken !== undefined) add(`${at}/model/bosToken`, "is only allowed with format 'tgi'.");
      } else {
        if (m.prefix !== undefined) add(`${at}/model/prefix`, "is only allowed with format 'openai'.");
        // TGI serves raw text: without a template no chat request can ever be turned into a prompt.
        if (!m.chatTemplate)
          add(
            `${at}/model/chatTemplate`,
            "is required with format 'tgi': the Jinja template that turns chat messages into the model's prompt.",
          );
      }
    }

    (s.replicas ?? []).forEach((r, j) => {
      const rat = `${at}/replicas/${j}`;
      const owner = replicaIds.get(r.id);
      if (owner) add(`${rat}/id`, `duplicates replica id "${r.id}" of ${owner}; replica ids are unique across the document.`);
      else replicaIds.set(r.id, `${rat}`);
      if (r.ssh && r.direct) add(rat, "must have either 'ssh' or 'direct', not both.");
      if (!r.ssh && !r.direct) add(rat, "must have either 'ssh' or 'direct'.");
      if (!r.ssh && (r.sshProxy || r.sshHeadProxy)) {
        add(r.sshProxy ? `${rat}/sshProxy` : `${rat}/sshHeadProxy`, "is only allowed with 'ssh'.");
      }
      for (const hop of ['sshProxy', 'sshHeadProxy'] as const) {
        const key = r[hop]?.privateKey;
        const keyProblem = key === undefined ? null : privateKeyProblem(key, readKey);
        if (keyProblem) add(`${rat}/${hop}/privateKey`, `${keyProblem}.`);
      }
      if (r.ssh && project && !project.hasKey) {
        // The destination hop always authenticates with the project's key.
        add(`${rat}/ssh`, `needs a private key: project "${s.project.toLowerCase()}" has no sshPrivateKey.`);
      }
    });
  });

  entrypoints.forEach((e, i) => {
    const at = `/spec/entrypoints/${i}`;
    if (!projectKeys.has(e.project.toLowerCase())) {
      add(`${at}/project`, `names project "${e.project.toLowerCase()}", which is not in /spec/projects.`);
    }
    checkDomain(e.domain, `${at}/domain`);
  });

  if (spec.acme?.server !== undefined && !URL.canParse(spec.acme.server)) {
    add('/spec/acme/server', `must be a URL; got ${JSON.stringify(spec.acme.server)}.`);
  }
  return issues;
}
