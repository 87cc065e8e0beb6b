export { registerModelApi, type ModelApiOptions } from './plugin.js';
export { nginxForwarder, connectForwarder, entrypointClient, peerClient, type ForwardedClient, type Forwarder, type UpstreamRequest, type UpstreamResponse, type ConnectFn } from './forwarders.js';
export { fileFirstSeenStore, memoryFirstSeenStore, modelKey, type FirstSeenStore } from './first-seen.js';
export { observeModels, catalogOf } from './catalog.js';
export { ModelApiError } from './errors.js';
