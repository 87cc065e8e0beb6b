// Certificates shared by a fleet of gateways on one database: one gateway at a time orders a
// domain's certificate (a lock the database releases if that gateway dies), the result, the
// ACME account and the HTTP-01 key authorizations live in the database, and every other gateway
// installs the stored certificate without calling the CA. The TLS loop only sees this interface;
// src/gateway/postgres-certificates.ts is the PostgreSQL one.

import type { BackoffFile, DomainBackoff } from './backoff.js';

/** A stored certificate's figures, without its PEMs (what a pass over every domain reads). */
export interface StoredCertificateInfo {
  serial: string;
  notBefore: number;
  notAfter: number;
}

export interface StoredCertificate extends StoredCertificateInfo {
  domain: string;
  certPem: string;
  keyPem: string;
  /** The ACME settings' fingerprint it was obtained with (no secret in it). */
  acmeKey: string;
}

/** Held while this gateway orders a domain's certificate; the database drops it if we die. */
export interface IssuerLock {
  release(): Promise<void>;
}

/** certbot's account files for one ACME server: path under its config dir → content. */
export type AccountFiles = Record<string, string>;

/** The persisted ACME backoff of the whole fleet: read fresh, changed in one transaction. */
export interface SharedBackoffData {
  read(): Promise<BackoffFile | null>;
  /** Applies `mutate` to the stored data under a row lock and stores the result. */
  change(mutate: (data: BackoffFile) => void): Promise<void>;
}

export interface SharedCertificates {
  /** Every stored certificate's figures. */
  list(): Promise<Map<string, StoredCertificateInfo>>;
  get(domain: string): Promise<StoredCertificate | null>;
  /** Stores a certificate checked by the caller; a later one for the domain replaces it. */
  put(cert: StoredCertificate, issuedBy: string): Promise<void>;
  /** The domain's issuer lock, or null when another gateway holds it. */
  lock(domain: string): Promise<IssuerLock | null>;
  /** The key authorization stored for an HTTP-01 token, or null. */
  challenge(token: string): Promise<string | null>;
  account(acmeKey: string): Promise<AccountFiles | null>;
  /** Stores the account unless one is stored already for these settings. */
  saveAccount(acmeKey: string, files: AccountFiles): Promise<void>;
  backoff: SharedBackoffData;
  /** The environment certbot's HTTP-01 hooks need to store and remove key authorizations. */
  hookEnv(): Record<string, string>;
  /** `listener` runs when any gateway stores a certificate. */
  onChange(listener: () => void): void;
  close(): Promise<void>;
}

/** The fresh shape of a backoff document from whatever the database held. */
export function backoffFrom(raw: unknown): BackoffFile {
  const parsed = (raw && typeof raw === 'object' ? raw : {}) as Partial<BackoffFile>;
  const domains: Record<string, DomainBackoff> = {};
  if (parsed.domains && typeof parsed.domains === 'object') {
    for (const [d, e] of Object.entries(parsed.domains)) {
      if (e && typeof e === 'object' && Array.isArray((e as DomainBackoff).attempts)) domains[d] = e as DomainBackoff;
    }
  }
  const orders = Array.isArray(parsed.orders) ? parsed.orders.filter((t): t is number => typeof t === 'number') : [];
  return { version: 1, domains, orders };
}
