// The CORS of an OpenAI-format model's endpoint, as dstack's gateway sets it: any origin, the
// methods and headers an OpenAI client sends. One rule for the service's own site and for the
// data plane, which serves the same host by Host until that site is in.

import type { Service } from './types.js';

export const MODEL_CORS_ORIGIN = '*';
export const MODEL_CORS_METHODS = 'GET, POST, PUT, PATCH, DELETE, OPTIONS';
export const MODEL_CORS_HEADERS = 'Authorization, Content-Type, Accept, OpenAI-Organization, OpenAI-Project, X-Requested-With';

/** Whether a service's endpoint answers with the model CORS (and answers preflights itself). */
export function servesCors(s: Service): boolean {
  return s.model?.format === 'openai';
}
