// JSON Schema (draft-07) of the desired-state document, as a user writes it: defaults may be
// omitted. Checks that need more than one field, or a better sentence than ajv gives
// (domains, prefixes, header names, duplicates), live in semantic.ts.

/** Names of projects, runs, replica and service ids: they reach URLs and Nginx files. */
export const NAME_PATTERN = '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$';
/**
 * Project names as dstack allows them (a leading '-' or '_' included). They reach URLs, Nginx
 * zone and file names, never argv or a shell.
 */
export const PROJECT_PATTERN = '^[A-Za-z0-9_-]{1,64}$';
/** Who manages a service (`dstack-server` for the compatibility routes). */
export const OWNER_PATTERN = '^[a-z0-9][a-z0-9._-]{0,63}$';
/** Host names and IP addresses of SSH hops and direct replicas. */
export const HOST_PATTERN = '^[A-Za-z0-9._:\\[\\]-]{1,253}$';
export const USER_PATTERN = '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$';
export const FINGERPRINT_PATTERN = '^SHA256:[A-Za-z0-9+/]{43}=?$';
/** URL path prefixes (rate limits, model prefix): nothing Nginx could read as syntax, no control characters. */
export const PREFIX_PATTERN = '^/[^\\s\\\\{};\'"$#\\u0000-\\u001f\\u007f]*$';
/** HTTP header names (RFC 9110 token characters Nginx accepts in `$http_<name>`). */
export const HEADER_PATTERN = '^[A-Za-z0-9-]{1,64}$';

const port = { type: 'integer', minimum: 1, maximum: 65535 } as const;
const noControl = '^[^\\u0000-\\u001f\\u007f]*$';

const sshHop = {
  type: 'object',
  additionalProperties: false,
  required: ['host', 'user'],
  properties: {
    host: { type: 'string', pattern: HOST_PATTERN },
    port,
    user: { type: 'string', pattern: USER_PATTERN },
    hostKeyFingerprint: { type: 'string', pattern: FINGERPRINT_PATTERN },
  },
} as const;

const privateKey = { type: 'string', minLength: 1, maxLength: 65536 } as const;

const sshProxyHop = {
  ...sshHop,
  properties: { ...sshHop.properties, privateKey },
} as const;

export const proxyStateSchema = {
  $schema: 'http://json-schema.org/draft-07/schema#',
  $id: 'https://dstack.ai/schemas/proxy-state.json',
  title: 'ProxyState',
  type: 'object',
  additionalProperties: false,
  required: ['apiVersion', 'kind', 'spec'],
  properties: {
    apiVersion: { const: 'proxy.dstack.ai/v1alpha1' },
    kind: { const: 'ProxyState' },
    metadata: {
      type: 'object',
      additionalProperties: false,
      properties: {
        generation: { type: 'integer', minimum: 0 },
        hash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
      },
    },
    spec: {
      type: 'object',
      additionalProperties: false,
      properties: {
        acme: {
          type: 'object',
          additionalProperties: false,
          properties: {
            server: { type: 'string', pattern: '^https?://[^\\s"\'{};$]+$', maxLength: 2048 },
            eabKid: { type: 'string', pattern: '^[A-Za-z0-9_=+/.-]{1,512}$' },
            eabHmacKey: { type: 'string', pattern: '^[A-Za-z0-9_=+/-]{1,512}$' },
            email: { type: 'string', pattern: '^[^@\\s"\'{};$]+@[^@\\s"\'{};$]+$', maxLength: 254 },
          },
          dependencies: { eabKid: ['eabHmacKey'], eabHmacKey: ['eabKid'] },
        },
        projects: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['name'],
            properties: {
              name: { type: 'string', pattern: PROJECT_PATTERN },
              sshPrivateKey: privateKey,
            },
          },
        },
        services: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['project', 'run'],
            properties: {
              project: { type: 'string', pattern: PROJECT_PATTERN },
              run: { type: 'string', pattern: NAME_PATTERN },
              id: { type: 'string', pattern: NAME_PATTERN },
              owner: { type: 'string', pattern: OWNER_PATTERN },
              domain: { type: 'string' },
              routerAllowlist: { type: 'boolean' },
              readTimeout: { type: 'integer', minimum: 1, maximum: 86400 },
              https: { type: 'boolean' },
              auth: { type: 'boolean' },
              clientMaxBodySize: { type: 'integer', minimum: 0, maximum: 1099511627776 },
              stripPrefix: { type: 'boolean' },
              rateLimits: {
                type: 'array',
                maxItems: 64,
                items: {
                  type: 'object',
                  additionalProperties: false,
                  required: ['prefix', 'key', 'rps'],
                  properties: {
                    prefix: { type: 'string', maxLength: 1024 },
                    key: {
                      type: 'object',
                      additionalProperties: false,
                      required: ['type'],
                      properties: {
                        type: { enum: ['ipAddress', 'header'] },
                        header: { type: 'string' },
                      },
                    },
                    rps: { type: 'number', exclusiveMinimum: 0, maximum: 1000000 },
                    burst: { type: 'integer', minimum: 0, maximum: 1000000 },
                  },
                },
              },
              model: {
                type: 'object',
                additionalProperties: false,
                required: ['name', 'format'],
                properties: {
                  name: { type: 'string', minLength: 1, maxLength: 256, pattern: noControl },
                  format: { enum: ['openai', 'tgi'] },
                  prefix: { type: 'string', maxLength: 1024 },
                  chatTemplate: { type: 'string', maxLength: 1048576 },
                  eosToken: { type: 'string', maxLength: 256 },
                  bosToken: { type: 'string', maxLength: 256 },
                },
              },
              replicas: {
                type: 'array',
                items: {
                  type: 'object',
                  additionalProperties: false,
                  required: ['id', 'appPort'],
                  properties: {
                    id: { type: 'string', pattern: NAME_PATTERN },
                    appPort: port,
                    hostKeyPolicy: { enum: ['tofu', 'tofu-per-replica'] },
                    ssh: sshHop,
                    sshProxy: sshProxyHop,
                    sshHeadProxy: sshProxyHop,
                    direct: {
                      type: 'object',
                      additionalProperties: false,
                      required: ['host', 'port'],
                      properties: { host: { type: 'string', pattern: HOST_PATTERN }, port },
                    },
                  },
                },
              },
            },
          },
        },
        entrypoints: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['project', 'domain'],
            properties: {
              project: { type: 'string', pattern: PROJECT_PATTERN },
              domain: { type: 'string' },
              https: { type: 'boolean' },
            },
          },
        },
      },
    },
  },
} as const;
