export {
  createTlsLoop,
  httpsDomains,
  acmeKeyOf,
  type TlsLoop,
  type TlsLoopOptions,
  type TlsDesired,
  type TlsObserved,
  type TlsPayload,
} from './loop.js';
export { publishedPaths, certificateOutputsOf, domainConditions, TLS_LOOP, type DomainInfo, type PublishedPaths } from './status.js';
export { checkCertificate, readCertificate, renewalTime, RENEW_AFTER_FRACTION, type CertInfo, type CertCheck } from './certificate.js';
export {
  decide,
  needsIssuing,
  triggerPolicies,
  holdPolicies,
  type Decision,
  type DomainInput,
  type Hold,
  type Trigger,
} from './policies.js';
export {
  CertbotRunner,
  certbotArgs,
  errorLine,
  scrub,
  secret,
  DEFAULT_CERTBOT_TIMEOUT_MS,
  type AcmeSettings,
  type CertbotDirs,
  type Secret,
} from './certbot.js';
export {
  TLS_BACKOFF_SCHEDULE_MS,
  MAX_ATTEMPTS_PER_DOMAIN_PER_HOUR,
  MAX_ORDERS_PER_3H,
  DNS_RETRY_MS,
  attemptsInNextHour,
  nextAllowed,
  delayAfter,
  type DomainBackoff,
  type Limits,
} from './backoff.js';
