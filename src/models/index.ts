export { registerModelApi, type ModelApiOptions } from './plugin.js';
export { ENTRYPOINT_KEY_HEADER, nginxForwarder, replicaForwarder, entrypointClient, peerClient } from './forwarders.js';
export type { ForwardedClient, Forwarder, UpstreamRequest, UpstreamResponse } from './types.js';
export { fileFirstSeenStore, memoryFirstSeenStore, modelKey, type FirstSeenStore } from './first-seen.js';
export { observeModels, catalogOf } from './catalog.js';
export { ModelApiError } from './errors.js';
